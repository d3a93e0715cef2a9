"""Wall-clock marks of a job's start-up and run, as absolute epoch seconds, so marks taken in
different processes (the launcher, each rank) line up. run.json `timing` holds them and the
phases between them: where a job's fixed cost goes (issue: start-up and sweep throughput).
"""
from __future__ import annotations

import os
import time

# Order of the phases in a job's life; run.json timing.phases_s follows it.
PHASES = ("launcher_start", "preflight_done", "job_start", "ranks_spawned", "rank_process_start", "imports_done",
          "model_built", "first_step", "last_step", "record_written", "ranks_exited")


def process_start_time(pid: int | str = "self") -> float | None:
    """When this process started (epoch s), from /proc (Linux); None elsewhere. It includes the
    interpreter's own start-up and imports, which a time.time() at the top of main() misses."""
    try:
        fields = open(f"/proc/{pid}/stat").read().rsplit(")", 1)[1].split()
        ticks = int(fields[19])                                 # starttime: clock ticks since boot
        # boot time from uptime (10 ms), not /proc/stat's btime (whole seconds: up to 1 s off)
        boot = time.time() - float(open("/proc/uptime").read().split()[0])
    except (OSError, ValueError, IndexError):
        return None
    return boot + ticks / os.sysconf("SC_CLK_TCK")


def phases(marks: dict[str, float], origin: str) -> dict[str, float]:
    """Seconds from marks[origin] to each later mark, in PHASES order (missing marks left out)."""
    t0 = marks[origin]
    return {k: round(marks[k] - t0, 4) for k in PHASES if k in marks and marks[k] is not None}


def now() -> float:
    return time.time()

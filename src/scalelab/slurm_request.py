"""What a SLURM job asks for, checked before it is submitted: a job the scheduler can never start
must be refused in one line, not left pending while `--wait` says nothing (a user walkthrough,
2026-12-01: 2 ranks x 8 CPUs on a 4-CPU node sat in PENDING (PartitionConfig) for good; a --time
under the warning signal's delay requeued the job every 30 s, forever).

- time_seconds / check_times: sbatch's --time formats, and a limit that leaves the job time to
  train before the USR1 warning (scalelab.requeue saves and requeues on it).
- test_only: `sbatch --test-only` on the finished script: slurmctld answers whether and when the
  job could run on this cluster (its partitions, nodes, CPUs, GPUs, limits) without queueing it.
"""
from __future__ import annotations

import re
import subprocess
from pathlib import Path

TIME_FORMATS = "MINUTES, MM:SS, HH:MM:SS, D-HH, D-HH:MM or D-HH:MM:SS (or UNLIMITED)"
_TIME = re.compile(r"^(?:(\d+)-)?(\d+)(?::(\d+))?(?::(\d+))?$")
# Start-up (imports, data, model, first steps) measured 10-30 s per job on CPU here and 23-45 s on a
# GPU host (issue 11): an attempt shorter than this between its start and the warning signal saves
# little or nothing before it is requeued again.
MIN_TRAIN_BEFORE_SIGNAL_S = 120


def time_seconds(text: str, name: str = "--time") -> int | None:
    """sbatch --time in seconds; None for no limit. ValueError naming the value and the formats."""
    t = str(text).strip()
    if t.upper() in ("UNLIMITED", "INFINITE"):
        return None
    m = _TIME.match(t)
    if m is None:
        raise ValueError(f"{name} {t!r} is not a SLURM time: use {TIME_FORMATS}")
    days, a, b, c = m.groups()
    if days is not None:      # D-HH[:MM[:SS]]
        secs = int(days) * 86400 + int(a) * 3600 + int(b or 0) * 60 + int(c or 0)
    elif c is not None:       # HH:MM:SS
        secs = int(a) * 3600 + int(b) * 60 + int(c)
    elif b is not None:       # MM:SS
        secs = int(a) * 60 + int(b)
    else:                     # MINUTES
        secs = int(a) * 60
    if secs <= 0:
        raise ValueError(f"{name} {t!r} must be longer than 0")
    return secs


def check_times(time: str, signal_delay_s: int, names: tuple[str, str] = ("--time", "--signal-delay")) -> None:
    """The time limit must leave MIN_TRAIN_BEFORE_SIGNAL_S of training before the USR1 warning."""
    if int(signal_delay_s) < 0:
        raise ValueError(f"{names[1]} {signal_delay_s} must be >= 0 (seconds before the time limit)")
    secs = time_seconds(time, names[0])
    if secs is not None and secs - int(signal_delay_s) < MIN_TRAIN_BEFORE_SIGNAL_S:
        raise ValueError(f"{names[0]} {time} ({secs} s) leaves {secs - int(signal_delay_s)} s before the warning signal "
                         f"({names[1]} {signal_delay_s} s before the limit): each attempt would save and requeue "
                         f"before it trains; give {names[0]} of at least "
                         f"{int(signal_delay_s) + MIN_TRAIN_BEFORE_SIGNAL_S} s or a smaller {names[1]}")


def _partitions() -> str:
    """`name: N node(s) x C CPUs [GRES]` per partition, from sinfo; '' if sinfo says nothing."""
    try:
        out = subprocess.run(["sinfo", "-h", "-o", "%P|%D|%c|%G|%l"], capture_output=True, text=True,
                             timeout=30).stdout
    except (OSError, subprocess.TimeoutExpired):
        return ""
    parts = []
    for line in out.splitlines():
        name, nodes, cpus, gres, limit = (line.split("|") + [""] * 5)[:5]
        extra = f" {gres}" if gres and gres != "(null)" else ""
        parts.append(f"{name} ({nodes} node(s) x {cpus} CPUs{extra}, time limit {limit})")
    return "; ".join(parts)


def test_only(script: Path, asked: str) -> None:
    """`sbatch --test-only SCRIPT`: ValueError (one line: SLURM's reason, what was asked, what this
    cluster has) when the scheduler could never start the job. `asked`: the request, in words."""
    try:
        proc = subprocess.run(["sbatch", "--test-only", str(script)], capture_output=True, text=True, timeout=60)
    except FileNotFoundError:
        raise RuntimeError("sbatch not found: run this on a SLURM login node") from None
    if proc.returncode == 0:
        return
    words = [ln.strip() for ln in (proc.stderr + proc.stdout).splitlines() if ln.strip()]
    why = words[-1] if words else f"sbatch --test-only exited {proc.returncode}"
    why = re.sub(r"^(sbatch: error: |allocation failure: )", "", why)
    have = _partitions()
    raise ValueError(f"SLURM would never start this job ({why}): asked for {asked}"
                     + (f"; partitions here: {have}" if have else "") + "; nothing was submitted")

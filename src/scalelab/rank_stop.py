"""How a launcher stops its ranks: the grace they get after its SIGTERM to save a checkpoint
(stop_grace_s), the wait meanwhile (wait_for, pumping their output), the console's line for it
(stopping_line) and the SIGTERM-then-SIGKILL of the launcher's process group (kill_group).
Used by scalelab.launch (torchrun, srun) and scalelab.spawn (launcher=local)."""
from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

# How long the ranks get after the launcher's SIGTERM before SIGKILL. A job that checkpoints
# (checkpoint.every_n_steps or checkpoint.save) saves at its next step first (scalelab.requeue,
# outside SLURM too): its step in flight plus one save, STOP_GRACE_S unless checkpoint.stop_grace_s
# says; any other job has nothing to save, and a peer's failure or a timeout leaves nothing to save
# either (a save needs every rank): KILL_WAIT_S, as before. A platform that stops the launcher
# (Kubernetes' terminationGracePeriodSeconds, docker stop -t) must give it the grace and a margin.
KILL_WAIT_S = 5.0
STOP_GRACE_S = 60.0


def stop_grace_s(job_dir: Path) -> float:
    """The ranks' grace after SIGTERM for the job in job_dir (its resolved config)."""
    import yaml

    from scalelab.paths import CONFIG_FILE
    from scalelab.requeue import saves_on_sigterm

    try:
        cfg = yaml.safe_load((Path(job_dir) / CONFIG_FILE).read_text()) or {}
    except (OSError, yaml.YAMLError):
        return KILL_WAIT_S
    given = (cfg.get("checkpoint") or {}).get("stop_grace_s")
    if isinstance(given, (int, float)) and not isinstance(given, bool) and given > 0:
        return float(given)
    return STOP_GRACE_S if saves_on_sigterm(cfg) else KILL_WAIT_S


def wait_for(done, seconds: float, pump=None, stopping: bool = False) -> bool:
    """Wait until done() or `seconds` pass, calling pump(wait) meanwhile (the ranks' output goes on to
    the console and ranks.log: their save line; pump returns None at the output's end). stopping:
    the wait is already for a Ctrl-C or SIGTERM, and another one ends it at once (the caller then
    kills); otherwise a Ctrl-C raises as anywhere. Returns done()."""
    end = time.monotonic() + seconds
    try:
        while not done() and time.monotonic() < end:
            if pump is not None:
                if pump(min(0.2, max(0.0, end - time.monotonic()))) is None:
                    pump = None
            else:
                time.sleep(0.05)
    except KeyboardInterrupt:
        if not stopping:
            raise
    return done()


def stopping_line(grace: float) -> None:
    """The console's line while the ranks save before stopping (a Ctrl-C or SIGTERM)."""
    if grace > KILL_WAIT_S:
        print(("\n" if sys.stderr.isatty() else "") + "[scalelab] stopping: the ranks save a checkpoint at their "
              f"next step (up to {grace:g} s; Ctrl-C again ends them now)", file=sys.stderr, flush=True)


def kill_group(proc: subprocess.Popen, grace: float = KILL_WAIT_S, pump=None, stopping: bool = False) -> None:
    """SIGTERM the launcher's group, wait up to `grace` for the launcher (pumping its output; a
    second Ctrl-C ends the wait where `stopping` for one), then SIGKILL whatever is left of it."""
    try:
        pgid = os.getpgid(proc.pid)
    except ProcessLookupError:
        pgid = proc.pid  # leader gone; its group may still hold ranks
    for sig, wait in ((signal.SIGTERM, grace), (signal.SIGKILL, KILL_WAIT_S)):
        try:
            os.killpg(pgid, sig)
        except (ProcessLookupError, PermissionError):
            return
        if not wait_for(lambda: proc.poll() is not None, wait, pump, stopping):
            continue
        time.sleep(0.2)

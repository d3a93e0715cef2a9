"""launch.run_ranks's start_by: a launcher that has started no rank (a scalelab.worker child) by then
is ended with its whole process group, and the log says why (torchrun's rendezvous can wait
forever; tests/integration/test_multinode.py, marked slow, meets that with a real torchrun)."""
import subprocess
import sys
import time

from scalelab.launch import run_ranks

# a "launcher" that never starts a rank, with a child of its own that would outlive it
NEVER = [sys.executable, "-c", "import subprocess, sys, time; "
         "subprocess.Popen([sys.executable, '-c', 'import time; time.sleep(61.5)']); time.sleep(60)"]
# one whose child is a rank: start_by must leave it alone
RANK = [sys.executable, "-c", "import subprocess, sys; sys.exit(subprocess.call([sys.executable, '-c', "
        "'import time; time.sleep(3)', 'scalelab.worker']))"]


def _alive(pattern: str) -> bool:
    return subprocess.run(["pgrep", "-f", pattern], capture_output=True).returncode == 0


def test_a_launcher_that_starts_no_rank_is_ended_by_start_by(tmp_path):
    log = tmp_path / "ranks.log"
    t0 = time.monotonic()
    rc = run_ranks(NEVER, {}, log, timeout_s=120, start_by=(1.5, "no rank started within 1.5 s"))
    took = time.monotonic() - t0
    assert rc == 1 and 1.5 <= took < 10, (rc, took)
    assert log.read_text().strip().endswith("TimeoutError: no rank started within 1.5 s")
    assert not _alive(r"time\.sleep\(61\.5\)")   # the launcher's child went with its group


def test_a_launcher_whose_rank_runs_is_not_ended(tmp_path):
    log = tmp_path / "ranks.log"
    rc = run_ranks(RANK, {}, log, timeout_s=120, start_by=(1.0, "never said"))
    assert rc == 0 and "TimeoutError" not in log.read_text()

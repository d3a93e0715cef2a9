"""The rank launcher (torchrun, srun) ends when scalelab-train dies, even by SIGKILL: it runs in a
session of its own (so a timeout can end its whole group), and when a node's scalelab-train was
killed (`kill -9`, the OOM killer) its torchrun and ranks went on training as orphans with the
other node. They now get SIGTERM from the kernel (PR_SET_PDEATHSIG), set before the exec."""
import os
import signal
import subprocess
import sys
import textwrap
import time

import pytest

pytestmark = pytest.mark.skipif(not sys.platform.startswith("linux"), reason="prctl PR_SET_PDEATHSIG is Linux's")


def _alive(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] != "Z"
    except OSError:
        return False


def test_the_rank_launcher_ends_when_scalelab_train_is_killed(tmp_path):
    child_pid = tmp_path / "child.pid"
    parent = textwrap.dedent(f"""
        import sys
        from pathlib import Path
        from scalelab import launch
        cmd = [sys.executable, "-c", "import os, time; open({str(child_pid)!r}, 'w').write(str(os.getpid())); "
               "time.sleep(120)"]
        launch.run_ranks(cmd, dict(__import__('os').environ), Path({str(tmp_path / 'ranks.log')!r}), 300)
    """)
    proc = subprocess.Popen([sys.executable, "-c", parent])
    deadline = time.monotonic() + 60
    while not (child_pid.exists() and child_pid.read_text()):
        assert proc.poll() is None and time.monotonic() < deadline
        time.sleep(0.05)
    pid = int(child_pid.read_text())
    assert _alive(pid)
    os.kill(proc.pid, signal.SIGKILL)                 # no cleanup of its own can run
    proc.wait()
    deadline = time.monotonic() + 10
    while _alive(pid) and time.monotonic() < deadline:
        time.sleep(0.05)
    alive = _alive(pid)
    if alive:
        os.kill(pid, signal.SIGKILL)
    assert not alive, "the launcher outlived scalelab-train"

"""launcher=local: a command killed outright (kill -9, an OOM kill; a closed terminal's SIGHUP
kills the fork server with it) takes its ranks with it. The ranks are forks of the command's fork
server, in sessions of their own: they kept training as orphans (holding their GPUs) as long as
they wrote nothing to the command's closed pipe (found by review: a hung rank, or a run without a
progress bar). The server now dies with the command and each rank with the server
(PR_SET_PDEATHSIG; scalelab.fork_guard, spawn._rank_main)."""
import os
import signal
import subprocess
import time

import pytest

from ..conftest import BASE, TRAIN, env, worker_pids

pytestmark = pytest.mark.integration


def _server_pids(launcher: int) -> list[int]:
    """The fork server(s) the command started (their environment names it)."""
    out = []
    for d in os.listdir("/proc"):
        if d.isdigit():
            try:
                with open(f"/proc/{d}/environ", "rb") as f:
                    if f"SCALELAB_LAUNCHER_PID={launcher}\0".encode() in f.read():
                        out.append(int(d))
            except OSError:
                pass
    return out


@pytest.mark.skipif(not os.path.isdir("/proc"), reason="reads /proc")
@pytest.mark.parametrize("hung", [False, True], ids=["training", "hung"])
def test_a_killed_command_leaves_no_rank_running(tmp_path, hung):
    """Training ranks end on their SIGTERM; a hung one (rank 1 sleeps at step 3, rank 0 waits in
    its all-reduce for collective_timeout_s=600) never acts on it: each rank's watch kills its
    group after the stop grace (5 s here: the job saves no checkpoints)."""
    job = tmp_path / "job"
    hang = ["strategy._target_=tests.mutations.HangingDDP", "trainer.collective_timeout_s=600"] if hung else []
    proc = subprocess.Popen([*TRAIN, *BASE, "strategy=ddp", "trainer.devices=2", "trainer.max_steps=5000",
                             "logger=none", *hang, f"hydra.run.dir={job}"], cwd=tmp_path, env=env(),
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True)
    try:
        deadline = time.monotonic() + 120
        while not (job / ".progress").exists():      # training: rank 0 has finished a step
            assert proc.poll() is None and time.monotonic() < deadline
            time.sleep(0.2)
        time.sleep(3.0 if hung else 0.0)                # steps 2 and 3 take < 1 s: rank 1 hangs, rank 0 waits
        assert len(worker_pids(tmp_path)) == 2 and _server_pids(proc.pid)
        os.kill(proc.pid, signal.SIGKILL)
        proc.wait()
        deadline = time.monotonic() + 30
        while worker_pids(tmp_path) or _server_pids(proc.pid):
            assert time.monotonic() < deadline, (worker_pids(tmp_path), _server_pids(proc.pid))
            time.sleep(0.2)
    finally:
        for pid in worker_pids(tmp_path) + _server_pids(proc.pid):
            os.kill(pid, signal.SIGKILL)

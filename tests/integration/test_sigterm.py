"""SIGTERM to scalelab-train outside SLURM (`timeout`, `docker stop`, a pod's eviction) ends it as
Ctrl-C does: its ranks are ended and one line names the job and how to go on, exit 143. Before,
the command died without a line, and its ranks failed on a broken pipe."""
import os
import signal
import subprocess
import time

import pytest

from ..conftest import FAST, TRAIN, env, worker_pids

pytestmark = pytest.mark.integration


def test_sigterm_ends_the_job_with_one_line(tmp_path):
    job = tmp_path / "job"
    proc = subprocess.Popen(TRAIN + [*FAST, "strategy=ddp", "trainer.devices=2", "trainer.max_steps=100000",
                                     "checkpoint.every_n_steps=5", "logger=none", f"hydra.run.dir={job}"],
                            cwd=tmp_path, env=env(), stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    deadline = time.monotonic() + 120
    while not (job / "checkpoints" / "step-00000005.ckpt.manifest.json").exists():
        assert proc.poll() is None and time.monotonic() < deadline, proc.communicate()
        time.sleep(0.1)
    os.kill(proc.pid, signal.SIGTERM)
    out, err = proc.communicate(timeout=60)
    assert proc.returncode == 143, err[-2000:]
    assert f"[scalelab] interrupted (SIGTERM) in {job}: the same command with hydra.run.dir={job} goes on" in err, err
    assert "Traceback" not in err and not worker_pids(tmp_path)

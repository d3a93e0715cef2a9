"""A job whose rank is killed mid-sweep (as the OOM killer would) is recorded as failed; the
other jobs complete; aggregation reports it; the command exits 1 and leaves no rank behind."""
import json
import os
import signal
import subprocess
import threading
import time
from pathlib import Path

import pytest

from ..conftest import FAST, TRAIN, env, records, worker_pids

pytestmark = pytest.mark.integration


def _kill_rank_when_training(job_dir: Path, stop: threading.Event, killed: list) -> None:
    log = job_dir / "ranks.log"
    while not stop.is_set():
        if log.exists() and "Starting with 2 processes" in log.read_text(errors="replace"):
            time.sleep(1.0)  # into the training loop
            pids = worker_pids(job_dir)
            if pids:
                os.kill(max(pids), signal.SIGKILL)
                killed.append(max(pids))
                return
        time.sleep(0.1)


def test_killed_rank_fails_its_job_not_the_sweep(tmp_path):
    sweep = tmp_path / "sweep"
    stop, killed = threading.Event(), []
    watcher = threading.Thread(target=_kill_rank_when_training, args=(sweep / "0", stop, killed), daemon=True)
    watcher.start()
    proc = subprocess.run(TRAIN + ["-m", "strategy=ddp", "trainer.devices=2", "seed=1,2", "trainer.max_steps=150",
                                   "trainer.warmup_steps=2", "logger=none", f"hydra.sweep.dir={sweep}", *FAST[:2]],
                          cwd=tmp_path, env=env(), capture_output=True, text=True, timeout=900)
    stop.set()
    assert killed, f"the watcher never found job 0's ranks\n{proc.stdout[-3000:]}\n{proc.stderr[-3000:]}"
    recs = {r["job"]["num"]: r for r in records(sweep)}
    assert sorted(recs) == [0, 1]
    assert recs[1]["status"] == "completed"     # the job after the failed one still ran
    assert recs[0]["status"] == "failed" and recs[0]["error"]
    assert recs[0]["world_size"] == 2 and recs[0]["strategy"] == "ddp"  # what was known before the crash
    summary = json.loads((sweep / "sweep.json").read_text())
    assert summary["num_failed"] == 1 and summary["failed"][0]["job"] == recs[0]["job"]["name"]
    assert proc.returncode == 1 and "1 job(s) failed" in proc.stderr
    assert "FAILED" in proc.stdout
    assert worker_pids(sweep) == []

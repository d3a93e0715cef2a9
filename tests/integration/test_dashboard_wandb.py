"""W&B online with a server that cannot be reached (an API key, WANDB_BASE_URL on a closed local
port): a real 2-rank job still trains, writes a complete run.json, logs ONE offline W&B run (rank 0's)
and prints ONE warning line saying how to sync; the API key is nowhere in the job's files."""
from __future__ import annotations

import os
import re
import signal
import threading
import time
from pathlib import Path

import pytest

from scalelab.results.wandb_offline import find_runs, read_run

from ..conftest import FAST, cmdlines, read_record, train, worker_pids

pytestmark = pytest.mark.integration
FAKE_KEY = "0123456789abcdef0123456789abcdef01234567"   # 40 characters: a well-formed W&B key


def test_online_init_error_trains_offline_with_one_warning(tmp_path, monkeypatch):
    monkeypatch.setenv("WANDB_API_KEY", FAKE_KEY)
    monkeypatch.setenv("WANDB_BASE_URL", "http://127.0.0.1:9")   # discard port: connection refused
    monkeypatch.setenv("WANDB_INIT_TIMEOUT", "5")                # W&B's own setting (default 90 s)
    job = tmp_path / "job"
    proc = train([*FAST, "strategy=ddp", "trainer.devices=2", "trainer.max_steps=8", "logger=wandb",
                  "logger.mode=online", f"hydra.run.dir={job}"], tmp_path, timeout=400)
    rec = read_record(job)
    assert rec["status"] == "completed" and rec["steps"] == 8 and rec["world_size"] == 2
    assert rec["throughput"]["samples_per_s"] > 0 and len(rec["loss"]["curve"]) == 8
    console = proc.stdout + proc.stderr
    warnings = [line for line in console.splitlines() if "W&B online init failed" in line]
    assert len(warnings) == 1, console[-3000:]
    assert f"wandb sync {job}/wandb/offline-run-*" in warnings[0]
    assert "anonymous setting has no effect" not in console     # wandb's own noise, once per run, is gone
    (path,) = find_runs(job)                                     # one run for the job, none for rank 1
    run = read_run(path)
    assert run["run"]["group"] == rec["job"]["group"] and run["run"]["job_type"] == "ddp"
    assert {k: run["config"][k] for k in ("world_size", "global_batch_size", "lr_rule")} == {
        "world_size": 2, "global_batch_size": rec["global_batch_size"], "lr_rule": rec["lr_rule"]}
    assert len([h for h in run["history"] if "train/loss" in h]) == 8
    assert run["summary"]["throughput/samples_per_s"] == pytest.approx(rec["throughput"]["samples_per_s"])
    # status as run.json says it (an earlier attempt the launcher marked failed had it "failed")
    assert run["summary"]["status"] == "completed" and run["summary"].get("error") is None, run["summary"]
    leaks = [p for p in job.rglob("*") if p.is_file() and FAKE_KEY.encode() in p.read_bytes()]
    assert leaks == []
    assert worker_pids(tmp_path) == []


def _wandb_core_of(job: Path) -> list[int]:
    """The W&B service processes (wandb-core ... --pid RANK_PID) of a rank of this job."""
    procs = dict(cmdlines())
    found = []
    for pid, argv in procs.items():
        if argv and argv[0].endswith(b"wandb-core") and b"--pid" in argv[:-1]:
            owner = procs.get(int(argv[argv.index(b"--pid") + 1] or -1), [])
            if str(job).encode() in b" ".join(owner):
                found.append(pid)
    return found


def test_a_w_and_b_service_that_dies_stops_the_logging_not_the_run(tmp_path):
    """A SLURM preemption's SIGTERM reaches every process of the step, W&B's service (wandb-core)
    too, which exits at once: rank 0's next log call raised ConnectionResetError and the rank died
    before its checkpoint (the requeued job went back to an older one). Here the service alone is
    ended with SIGTERM at step 60 of 300: the job must complete, with one warning line, no
    traceback, and the W&B history it had logged before kept in the offline run. Ranks as fresh
    interpreters (launcher=torchrun_local), as srun starts them: their exit runs wandb's atexit
    teardown, which printed the lost connection's traceback unless W&B was torn down first."""
    job = tmp_path / "job"
    killed: list[int] = []
    seen = {"progress": None, "services": 0, "errors": []}   # what the killer saw, for a failure message

    def kill_service_at(step: int) -> None:
        deadline = time.monotonic() + 300
        while time.monotonic() < deadline and not killed:
            try:
                now = int((job / ".progress").read_text())
            except (OSError, ValueError):
                now = -1
            seen["progress"] = now
            if now >= step:
                cores = _wandb_core_of(job)
                seen["services"] = max(seen["services"], len(cores))
                for pid in cores:
                    try:
                        os.kill(pid, signal.SIGTERM)
                        killed.append(now)
                    except OSError as e:   # gone since the scan: look again
                        seen["errors"].append(repr(e))
            time.sleep(0.02)

    # at step 60, not earlier: the service must have written some history by then (at step 20 a
    # loaded CI machine once had none on disk: `logged` empty)
    t = threading.Thread(target=kill_service_at, args=(60,), daemon=True)
    t.start()
    proc = train([*FAST, "strategy=single", "trainer.devices=1", "trainer.max_steps=300", "logger=wandb",
                  "logger.mode=offline", "launcher=torchrun_local", f"hydra.run.dir={job}"], tmp_path, timeout=400)
    t.join(timeout=5)
    assert killed and killed[0] < 300, f"the W&B service was not ended during the run: {seen}"
    rec = read_record(job)
    assert rec["status"] == "completed" and rec["steps"] == 300 and len(rec["loss"]["curve"]) == 300
    console = proc.stdout + proc.stderr
    warnings = [line for line in console.splitlines() if "W&B stopped logging" in line]
    assert len(warnings) == 1 and "ConnectionResetError" in warnings[0], console[-3000:]
    assert "Traceback" not in console, console[-3000:]
    # the console leaves torchrun's tracebacks out (launch.TracebackFilter): the log has every line
    assert "Traceback" not in (job / "ranks.log").read_text() and "traceback line(s) not shown" not in console
    stopped_at = int(re.search(r"W&B stopped logging at step (\d+)", warnings[0]).group(1))
    assert killed[0] - 1 <= stopped_at < 300   # (the log step may trail the progress file by one)
    (path,) = find_runs(job)   # what the service had before it went is kept, nothing after
    logged = [h["trainer/global_step"] for h in read_run(path)["history"] if "train/loss" in h]
    assert logged and max(logged) <= stopped_at, (logged[-3:], stopped_at)

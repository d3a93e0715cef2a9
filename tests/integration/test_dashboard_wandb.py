"""W&B online with a server that cannot be reached (an API key, WANDB_BASE_URL on a closed local
port): a real 2-rank job still trains, writes a complete run.json, logs ONE offline W&B run (rank 0's)
and prints ONE warning line saying how to sync; the API key is nowhere in the job's files."""
from __future__ import annotations

import pytest

from scalelab.results.wandb_offline import find_runs, read_run

from ..conftest import FAST, read_record, train, worker_pids

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
    leaks = [p for p in job.rglob("*") if p.is_file() and FAKE_KEY.encode() in p.read_bytes()]
    assert leaks == []
    assert worker_pids(tmp_path) == []

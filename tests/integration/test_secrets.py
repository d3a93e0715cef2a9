"""No secret reaches a file of the job or the console: WANDB_API_KEY from the environment and
secret-named overrides (`+secret_token=...`, `+logger.api_key=...`) are redacted in the saved
config (config_resolved.yaml, .hydra/), run.json, train.log, ranks.log and the output."""
import json
import subprocess

import yaml

from ..conftest import TRAIN, env

SECRETS = ("sk-secret-123", "abc123", "XyZ-api-987")


def test_no_secret_in_any_file_of_the_job(tmp_path):
    e = env()
    e["WANDB_API_KEY"] = "sk-secret-123"
    job = tmp_path / "job"
    proc = subprocess.run([*TRAIN, "model=gpt_nano", "strategy=single", "trainer.devices=1", "trainer.max_steps=8",
                           "trainer.warmup_steps=2", "trainer.enable_progress_bar=false", "logger=none",
                           "+secret_token=abc123", "+logger.api_key=XyZ-api-987", f"hydra.run.dir={job}"],
                          cwd=tmp_path, env=e, capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr[-3000:]
    files = [f for f in tmp_path.rglob("*") if f.is_file()]
    assert job / "run.json" in files and job / "config_resolved.yaml" in files and job / "ranks.log" in files
    for secret in SECRETS:
        assert secret not in proc.stdout and secret not in proc.stderr, secret
        leaks = [str(f) for f in files if secret.encode() in f.read_bytes()]
        assert not leaks, (secret, leaks)
    cfg = yaml.safe_load((job / "config_resolved.yaml").read_text())
    assert cfg["secret_token"] == "<redacted>" and cfg["logger"]["api_key"] == "<redacted>"
    rec = json.loads((job / "run.json").read_text())
    assert rec["status"] == "completed" and rec["config"]["secret_token"] == "<redacted>"
    assert "+secret_token=<redacted>" in rec["job"]["overrides"]


def test_no_secret_in_the_w_and_b_runs_of_a_sweep(tmp_path):
    """W&B keeps the process's command line (sys.argv[1:]) in a run's metadata: the job's run (rank
    0, forked with the launcher's argv) and the sweep's summary run held `+logger.api_key=...` as
    typed, in their .wandb files, and on W&B's server once synced or online (found by review)."""
    e = env()
    e["WANDB_API_KEY"] = "sk-secret-123"
    sweep = tmp_path / "sweep"
    proc = subprocess.run([*TRAIN, "-m", "model=gpt_nano", "strategy=single", "trainer.devices=1",
                           "trainer.max_steps=4", "trainer.warmup_steps=2", "trainer.enable_progress_bar=false",
                           "logger=wandb", "logger.mode=offline", "+secret_token=abc123",
                           "+logger.api_key=XyZ-api-987", f"hydra.sweep.dir={sweep}"],
                          cwd=tmp_path, env=e, capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr[-3000:]
    runs = sorted(sweep.rglob("run-*.wandb"))
    assert len(runs) == 2, runs                  # the job's run and the sweep summary's
    # the metadata is there, redacted: the override's key with <redacted> for its value
    assert all(b"+logger.api_key=<redacted>" in r.read_bytes() for r in runs)
    files = [f for f in tmp_path.rglob("*") if f.is_file()]
    for secret in SECRETS:
        leaks = [str(f) for f in files if secret.encode() in f.read_bytes()]
        assert not leaks, (secret, leaks)

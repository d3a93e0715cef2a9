"""The newcomer path, as a user runs it (the CLI): a quiet console with a step progress bar, an
honest short run, selective activation checkpointing, train.log, the slurm renderer and
`scalelab compare` marking short runs. One 2-rank job serves every check."""
from __future__ import annotations

import json
import subprocess
import sys

import pytest

from ..conftest import FAST, REPO, env, train

pytestmark = pytest.mark.integration


@pytest.fixture(scope="module")
def short_job(tmp_path_factory):
    cwd = tmp_path_factory.mktemp("newcomer")
    job = cwd / "job"
    # 6 steps, 2 of warm-up (FAST): 4 measured steps, fewer than the 5 a steady figure needs;
    # the profile window needs 3 + 3 steady steps, so it stays off.
    proc = train([*[a for a in FAST if a != "trainer.enable_progress_bar=false"], "strategy=ddp",
                  "trainer.devices=2", "trainer.max_steps=6", "logger=none",
                  "model.arch.activation_checkpointing=selective", f"hydra.run.dir={job}"], cwd)
    return job, proc


def test_console_is_quiet_and_counts_steps(short_job):
    _, proc = short_job
    console = proc.stdout + proc.stderr
    # (Lightning's hint to prepend `srun` shows where a SLURM client is installed, as in CI)
    for noise in ("GPU available", "TPU available", "Initializing distributed", "USDT", "Epoch 0/",
                  "The `srun` command is available", "`weights_only` was not set"):
        assert noise not in console, noise
    assert "step 6/6" in console and "tokens/s" in console
    assert console.count("step 6/6") == 1               # rank 0 alone draws the bar
    # 2 ranks: the bar's loss is rank 0's own batch, not the table's mean over ranks: it says so
    assert "rank-0 loss " in console.split("step 6/6", 1)[1].splitlines()[0]


def test_short_run_is_flagged_everywhere(short_job):
    job, proc = short_job
    rec = json.loads((job / "run.json").read_text())
    assert rec["short_run"] is True and rec["step_time_s"]["measured_steps"] == 4
    assert "warning: only 4 measured step(s)" in proc.stdout
    out = subprocess.run([sys.executable, "-m", "scalelab.cli", "compare", str(job)], cwd=REPO, env=env(),
                         capture_output=True, text=True, timeout=120).stdout
    assert "*" in out.splitlines()[2] and "fewer than 5 measured steps" in out


def test_selective_checkpointing_is_the_run(short_job):
    job, _ = short_job
    rec = json.loads((job / "run.json").read_text())
    assert rec["activation_checkpointing"] == "selective" and rec["status"] == "completed"
    assert rec["loss"]["final"] < rec["loss"]["first"]


def test_train_log_holds_the_jobs_lines(short_job):
    job, _ = short_job
    log = (job / "train.log").read_text()
    assert "strategy=ddp world=2" in log and "completed" in log


@pytest.mark.parametrize("value,want", [("true", "full"), ("false", "none"), ("selective", "selective"),
                                        ("sometimes", None)])
def test_checkpointing_values(tmp_path, value, want):
    """The config takes none|selective|full (booleans mapped); anything else stops before a rank."""
    key = f"model.arch.activation_checkpointing={value}"
    if want is not None:   # composed and validated as the trainer does, then read back by the planner
        proc = subprocess.run([sys.executable, "-m", "scalelab.cli", "plan", key, "--json"], cwd=tmp_path,
                              env=env(), capture_output=True, text=True, timeout=120)
        assert proc.returncode == 0, proc.stderr
        assert json.loads(proc.stdout)["inputs"]["activation_checkpointing"] == want
        return
    proc = subprocess.run([sys.executable, "-m", "scalelab.train", key, f"hydra.run.dir={tmp_path / 'job'}"],
                          cwd=tmp_path, env=env(), capture_output=True, text=True, timeout=120)
    assert proc.returncode == 2 and not (tmp_path / "job").exists()
    assert proc.stderr.count("\n") == 1
    assert "'sometimes' is not valid: choose one of none, selective, full" in proc.stderr


def test_slurm_render_keeps_the_trainer_layout(tmp_path):
    def render(*args):
        return subprocess.run([sys.executable, "-m", "scalelab.cli", "slurm", "render", *args,
                               "--log-dir", str(tmp_path / "logs")], cwd=tmp_path, env=env(),
                              capture_output=True, text=True, timeout=120)

    proc = render("--nodes", "2", "trainer.devices=4", "strategy=ddp")
    assert proc.returncode == 0, proc.stderr
    assert "#SBATCH --ntasks-per-node=4" in proc.stdout and "#SBATCH --gpus-per-node=4" in proc.stdout
    assert "trainer.num_nodes=2 trainer.devices=4" in proc.stdout
    assert (tmp_path / "logs").is_dir()                  # sbatch would not create --output's folder
    proc = render("--devices", "2", "trainer.devices=4")
    assert proc.returncode == 2 and "disagree" in proc.stderr and proc.stderr.count("\n") == 1

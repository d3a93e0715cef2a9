"""The newcomer path, as a user runs it (the CLI): a quiet console with a step progress bar, an
honest short run, selective activation checkpointing, train.log, the slurm renderer and
`scalelab compare` marking short runs. One 2-rank job serves every check."""
from __future__ import annotations

import json
import subprocess
import sys

import pytest

from ..conftest import FAST, REPO, env, run_cli, train

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
    # captured, not a terminal: step lines of their own (SLURM's .out held them as one \r-joined
    # line), and ranks.log a line per update whatever the console
    job, _ = short_job
    assert "\r" not in console and "\nstep 6/6 | " in console
    assert "\r" not in (job / "ranks.log").read_text()
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


def test_one_step_runs_and_the_hint_counts_the_default_warmup(tmp_path):
    """trainer.max_steps=1 passed validation, then every rank failed (Lightning's throughput window
    must be > 1); trainer.max_steps=3's hint said >= 7, and 7 steps then asked for 10. One step:
    0 warm-up (lowered from the default 5), so the hint is 0 + 5 (the default again) + 5 measured."""
    job = tmp_path / "s1"
    proc = train(["trainer.devices=1", "trainer.max_steps=1", "logger=none", f"hydra.run.dir={job}"], tmp_path)
    assert json.loads((job / "run.json").read_text())["status"] == "completed"
    assert "use trainer.max_steps >= 10" in proc.stdout, proc.stdout[-1500:]


def test_an_optuna_sweep_prints_no_library_noise(tmp_path):
    """-m experiment=lr_search printed 7 alembic "setup plugin" lines and Optuna's study line with raw
    colour codes (into files too)."""
    proc = train(["-m", "experiment=lr_search", "hydra.sweeper.n_trials=1", "trainer.max_steps=3", "logger=none",
                  f"hydra.sweep.dir={tmp_path / 'lr'}"], tmp_path)
    console = proc.stdout + proc.stderr
    assert "Best value:" in console and "Study name: lr_search" in console
    assert "alembic" not in console and "\x1b[" not in console and "A new study created" not in console


def test_failed_trials_of_an_optuna_search_are_one_line_each_and_the_search_goes_on(tmp_path):
    """Review 2026-12-04: a failed job returned NaN, which Optuna refused (and the sweeper's fallback
    again): the first failed trial ended the search with a two-exception traceback, no summary. Every
    trial fails here (rank 1 raises at step 3): each is its job's FAILED line, the second trial
    runs, the sweep is summarized, and the command says no trial completed, exit 1."""
    sweep = tmp_path / "lr"
    proc = train(["-m", "experiment=lr_search", "hydra.sweeper.n_trials=2", "trainer.max_steps=5", "logger=none",
                  "strategy._target_=tests.slurm.crash.CrashingDDP", f"hydra.sweep.dir={sweep}"], tmp_path,
                 check=False)
    console = proc.stdout + proc.stderr
    assert proc.returncode == 1 and "Traceback" not in console, console[-3000:]
    assert console.count("injected rank crash at step 3") >= 2 and "error: 2 job(s) failed" in console, console[-3000:]
    assert "[scalelab] no trial of the search completed" in console
    assert "float-castable" not in console and "max_failure_rate" not in console, console[-3000:]
    assert [json.loads((sweep / n / "run.json").read_text())["status"] for n in ("0", "1")] == ["failed", "failed"]
    summary = json.loads((sweep / "sweep.json").read_text())
    assert (summary["num_failed"], summary["num_completed"]) == (2, 0) and (sweep / "report.html").exists()


def test_selective_checkpointing_is_the_run(short_job):
    job, _ = short_job
    rec = json.loads((job / "run.json").read_text())
    assert rec["activation_checkpointing"] == "selective" and rec["status"] == "completed"
    assert rec["loss"]["final"] < rec["loss"]["first"]


def test_train_log_holds_the_jobs_lines(short_job):
    job, _ = short_job
    log = (job / "train.log").read_text()
    assert "strategy=ddp world=2" in log and "completed" in log


@pytest.mark.parametrize("value,want", [("true", "full"), ("false", "none"), ("selective", "selective")])
def test_checkpointing_values(tmp_path, monkeypatch, capsys, value, want):
    """The config takes none|selective|full (booleans mapped), composed and validated as the
    trainer does, then read back by the planner (`scalelab plan KEY=VALUE`, in this process).
    Anything else stops before a rank: test_bad_inputs_table's activation_checkpointing=sometimes."""
    monkeypatch.chdir(tmp_path)
    code, out = run_cli(["plan", f"model.arch.activation_checkpointing={value}", "--json"], capsys)
    assert code == 0, out.err
    assert json.loads(out.out)["inputs"]["activation_checkpointing"] == want


def test_slurm_render_keeps_the_trainer_layout(tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)

    def render(*args):   # `scalelab slurm render ARGS`, in this process
        return run_cli(["slurm", "render", *args, "--log-dir", str(tmp_path / "logs")], capsys)

    code, out = render("--nodes", "2", "trainer.devices=4", "strategy=ddp")
    assert code == 0, out.err
    assert "#SBATCH --ntasks-per-node=4" in out.out and "#SBATCH --gpus-per-node=4" in out.out
    assert "trainer.num_nodes=2 trainer.devices=4" in out.out
    assert (tmp_path / "logs").is_dir()                  # sbatch would not create --output's folder
    code, out = render("--devices", "2", "trainer.devices=4")
    assert code == 2 and "disagree" in out.err and out.err.count("\n") == 1

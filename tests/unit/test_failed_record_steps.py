"""A failed record says how far the run got and where its attempt started, as a completed one:
`steps` (the whole run), `resumed_at_step`, `steps_this_attempt` and the SLURM job. A SLURM job
that failed after a requeue said none of them, and one that failed before its first step after
resuming at step 40 said `steps: 0`."""
import pytest
from hydra import compose, initialize_config_dir
from omegaconf import OmegaConf

from scalelab import job_outcome
from scalelab.checkpointing import PROGRESS, RESUMED
from scalelab.config import validate
from scalelab.paths import conf_dir


@pytest.fixture(scope="module")
def job():
    with initialize_config_dir(config_dir=str(conf_dir()), version_base="1.3"):
        cfg = compose("train", overrides=["model=gpt_nano", "trainer.devices=2", "strategy=ddp"])
    resolved = OmegaConf.to_container(cfg, resolve=True)
    resolved["job"] = {"name": "j", "overrides": []}
    return resolved, validate(cfg)


def _failed(tmp_path, job, progress=None, resumed=None):
    for mark, value in ((PROGRESS, progress), (RESUMED, resumed)):
        (tmp_path / mark).unlink(missing_ok=True)
        if value is not None:
            (tmp_path / mark).write_text(str(value))
    return job_outcome.collect(tmp_path, 1, *job, 1)


def test_a_failed_record_says_where_its_attempt_started(tmp_path, job, monkeypatch):
    for k in ("SLURM_JOB_ID", "SLURM_RESTART_COUNT", "SLURM_JOB_PARTITION"):
        monkeypatch.delenv(k, raising=False)
    r = _failed(tmp_path, job)
    assert (r["steps"], r["resumed_at_step"], r["slurm"]) == (0, None, None) and "steps_this_attempt" not in r
    r = _failed(tmp_path, job, progress=45, resumed=40)
    assert (r["steps"], r["resumed_at_step"], r["steps_this_attempt"]) == (45, 40, 5)
    r = _failed(tmp_path, job, resumed=40)          # failed before its first step after the resume
    assert (r["steps"], r["resumed_at_step"]) == (40, 40) and "steps_this_attempt" not in r
    monkeypatch.setenv("SLURM_JOB_ID", "77")
    monkeypatch.setenv("SLURM_RESTART_COUNT", "2")
    monkeypatch.setenv("SLURM_JOB_PARTITION", "gpu")
    r = _failed(tmp_path, job, progress=45, resumed=40)
    assert (r["slurm"]["job_id"], r["slurm"]["requeues"], r["slurm"]["partition"]) == ("77", 2, "gpu")


def test_a_failure_before_the_first_step_after_a_resume_names_the_checkpoint(tmp_path, job):
    """A sharded checkpoint damaged at its full size (a flipped byte in a .distcp: nothing to check
    it against) failed every rerun in its load, 'PytorchStreamReader failed reading zip archive',
    naming no checkpoint and no way on."""
    ckpt = tmp_path / "checkpoints" / "step-00000040.ckpt"
    ckpt.mkdir(parents=True)
    log = tmp_path / "ranks.log"
    log.write_text("RuntimeError: out of memory\n")                # not a load's error: no hint
    assert "resuming from" not in _failed(tmp_path, job, resumed=40)["error"]
    log.write_text("RuntimeError: PytorchStreamReader failed reading zip archive: failed finding central directory\n")
    r = _failed(tmp_path, job, resumed=40)
    assert r["error"].startswith("ranks exited with code 1: RuntimeError: PytorchStreamReader failed")
    assert r["error"].endswith(f" (before its first step after resuming from {ckpt}: if that checkpoint is damaged, "
                               f"set it aside, mv {ckpt} {ckpt}.damaged, and the job goes on from the one before it; "
                               "or start over with checkpoint.resume=never)"), r["error"]
    assert "resuming from" not in _failed(tmp_path, job, progress=41, resumed=40)["error"]   # it trained on

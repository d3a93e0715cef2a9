"""A SLURM job requeued after its last step (`scontrol requeue` of a finished job, a preemption
between the last step and the exit): the batch step keeps a completed record of the same job, and
ranks that find the final checkpoint but no record redo only the steps since this job's
checkpoint before it. The real cluster runs the first case end to end in
tests/slurm/test_slurm_cluster.py."""
import json

import pytest
from omegaconf import OmegaConf

from scalelab import requeue, worker

JOB = {"SLURM_JOB_ID": "77", "SLURM_JOB_NODELIST": "n1", "SLURM_RESTART_COUNT": "1"}
OVERRIDES = ["strategy=ddp", "trainer.max_steps=100"]


def _record(job_id="77", status="completed", final=True, overrides=OVERRIDES):
    marks = {"record_written": 1.0, **({"ranks_exited": 2.0} if final else {})}
    return {"status": status, "slurm": {"job_id": job_id, "requeues": 0}, "timing": {"marks": marks},
            "job": {"overrides": list(overrides)}}


def test_only_the_final_completed_record_of_this_job_on_a_requeue_is_kept():
    assert requeue.completed_earlier(_record(), OVERRIDES, JOB)
    assert not requeue.completed_earlier(_record(), OVERRIDES, {**JOB, "SLURM_RESTART_COUNT": "0"})  # 1st attempt
    assert not requeue.completed_earlier(_record(), OVERRIDES, {})                 # not under SLURM
    assert not requeue.completed_earlier(_record(job_id="76"), OVERRIDES, JOB)     # another job's dir
    assert not requeue.completed_earlier(_record(status="failed"), OVERRIDES, JOB)
    assert not requeue.completed_earlier(_record(final=False), OVERRIDES, JOB)     # rank 0's part only
    assert not requeue.completed_earlier(_record(overrides=["strategy=fsdp"]), OVERRIDES, JOB)
    assert not requeue.completed_earlier(None, OVERRIDES, JOB)
    assert not requeue.completed_earlier({**_record(), "slurm": None}, OVERRIDES, JOB)  # a run outside SLURM


def _checkpoint(job_dir, step, slurm_job="77"):
    ckpt = job_dir / "checkpoints" / f"step-{step:08d}.ckpt"
    ckpt.parent.mkdir(parents=True, exist_ok=True)
    ckpt.write_bytes(b"x" * 10)
    ckpt.with_name(ckpt.name + ".manifest.json").write_text(json.dumps({"files": {"": 10}, "slurm_job": slurm_job}))


CFG = OmegaConf.create({"checkpoint": {"resume_from": None, "resume": "auto"}, "trainer": {"max_steps": 100}})


@pytest.fixture
def slurm_env(monkeypatch):
    for k in ("SLURM_ARRAY_JOB_ID", "SLURM_ARRAY_TASK_ID"):
        monkeypatch.delenv(k, raising=False)
    for k, v in JOB.items():
        monkeypatch.setenv(k, v)
    return monkeypatch


def test_a_requeue_after_the_last_step_redoes_the_last_interval_not_the_run(tmp_path, slurm_env):
    for step in (80, 90, 100):
        _checkpoint(tmp_path, step)
    path, step = worker._resume_point(CFG, tmp_path, rank=1)
    assert step == 90 and path.endswith("step-00000090.ckpt")
    slurm_env.delenv("SLURM_JOB_ID")   # the same dir run again by hand (its record incomplete): the same
    path, step = worker._resume_point(CFG, tmp_path, rank=1)
    assert step == 90 and path.endswith("step-00000090.ckpt")


def test_the_job_s_own_checkpoints_come_before_resume_from(tmp_path, slurm_env):
    """checkpoint.resume_from is where the job started; its own later checkpoints are where it got
    to (the Ctrl-C and restart lines name them): before, resume_from won and the steps since were
    trained again."""
    slurm_env.delenv("SLURM_JOB_ID")
    cfg = OmegaConf.merge(CFG, {"checkpoint": {"resume_from": "/runs/a/checkpoints/last.ckpt"}})
    assert worker._resume_point(cfg, tmp_path, rank=1) == ("/runs/a/checkpoints/last.ckpt", None)  # none yet
    _checkpoint(tmp_path, 20)
    path, step = worker._resume_point(cfg, tmp_path, rank=1)
    assert step == 20 and path.endswith("step-00000020.ckpt")
    never = OmegaConf.merge(cfg, {"checkpoint": {"resume": "never"}})
    assert worker._resume_point(never, tmp_path, rank=1) == ("/runs/a/checkpoints/last.ckpt", None)


def test_another_job_s_checkpoints_are_not_resumed(tmp_path, slurm_env):
    # an earlier job's finished run in this dir (80, 90, 100); this job has saved none of its own
    for step in (80, 90, 100):
        _checkpoint(tmp_path, step, slurm_job="12")
    assert worker._resume_point(CFG, tmp_path, rank=1) == (None, None)


def test_the_restart_line_names_where_the_ranks_go_on_from(tmp_path, slurm_env):
    """spawn's restart line asks checkpointing.goes_on_from, the choice the ranks make
    (worker._resume_point): it said 'start over from step 0' where they went on from
    checkpoint.resume_from, and 'resume from step N' under checkpoint.resume=never."""
    from scalelab.checkpointing import goes_on_from

    assert goes_on_from(tmp_path, 100) == ("start over from step 0 (no checkpoint yet: checkpoint.every_n_steps=N "
                                           "saves one every N steps)")
    assert goes_on_from(tmp_path, 100, start="/runs/a/last.ckpt") == "start from checkpoint.resume_from /runs/a/last.ckpt"
    for step in (80, 90, 100):
        _checkpoint(tmp_path, step)
    assert goes_on_from(tmp_path, 100) == "resume from step 90"          # the one before the last step
    assert goes_on_from(tmp_path, 200, start="/runs/a/last.ckpt") == "resume from step 100"   # its own first
    assert goes_on_from(tmp_path, 200, auto=False) == "start over from step 0 (checkpoint.resume=never)"

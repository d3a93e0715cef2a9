"""A SLURM job requeued after its last step (`scontrol requeue` of a finished job, a preemption
between the last step and the exit): the batch step keeps a completed record of the same job, and
ranks that find the final checkpoint but no record redo only the steps since the one before it.
The real cluster runs the first case end to end in tests/slurm/test_slurm_cluster.py."""
import json

from omegaconf import OmegaConf

from scalelab import requeue, worker

JOB = {"SLURM_JOB_ID": "77", "SLURM_JOB_NODELIST": "n1", "SLURM_RESTART_COUNT": "1"}


def _record(job_id="77", status="completed"):
    return {"status": status, "slurm": {"job_id": job_id, "requeues": 0}}


def test_only_a_completed_record_of_this_job_on_a_requeue_is_kept():
    assert requeue.completed_earlier(_record(), JOB)
    assert not requeue.completed_earlier(_record(), {**JOB, "SLURM_RESTART_COUNT": "0"})  # first attempt
    assert not requeue.completed_earlier(_record(), {})                                   # not under SLURM
    assert not requeue.completed_earlier(_record(job_id="76"), JOB)                       # another job's dir
    assert not requeue.completed_earlier(_record(status="failed"), JOB)
    assert not requeue.completed_earlier(None, JOB)
    assert not requeue.completed_earlier({"status": "completed", "slurm": None}, JOB)     # a run outside SLURM


def _checkpoint(job_dir, step):
    ckpt = job_dir / "checkpoints" / f"step-{step:08d}.ckpt"
    ckpt.parent.mkdir(parents=True, exist_ok=True)
    ckpt.write_bytes(b"x" * 10)
    ckpt.with_name(ckpt.name + ".manifest.json").write_text(json.dumps({"files": {"": 10}}))


def test_a_requeue_after_the_last_step_redoes_the_last_interval_not_the_run(tmp_path, monkeypatch):
    for step in (80, 90, 100):
        _checkpoint(tmp_path, step)
    cfg = OmegaConf.create({"checkpoint": {"resume_from": None, "resume": "auto"}, "trainer": {"max_steps": 100}})
    monkeypatch.setattr(requeue.os, "environ", dict(JOB))
    path, step = worker._resume_point(cfg, tmp_path, rank=1)
    assert step == 90 and path.endswith("step-00000090.ckpt")
    monkeypatch.setattr(requeue.os, "environ", {})        # the same dir run again by hand: start over
    assert worker._resume_point(cfg, tmp_path, rank=1) == (None, None)

"""A SLURM job that ended before writing its run record (cancelled, timed out, a crashed batch
step) gets a failed record from `slurm_jobs.finalize`; it names its sweep as the jobs' own records do
(job.sweep_dir), so compare and aggregate count it in that sweep and not as a single run."""
import json

from scalelab import slurm_jobs

STATE = {"state": "CANCELLED", "exit_code": "0:15", "reason": "cancelled", "node_list": "n1"}


def test_a_stand_in_record_names_its_sweep(tmp_path):
    sweep = tmp_path / "sw"
    job = sweep / "1"
    job.mkdir(parents=True)
    rec = slurm_jobs.finalize(job, STATE, "77", {"strategy": "ddp", "world_size": 2, "global_batch_size": 16,
                                            "name": "sw/1", "sweep_dir": str(sweep)})
    assert rec["status"] == "failed" and rec["job"]["sweep_dir"] == str(sweep)
    assert json.loads((job / "run.json").read_text())["job"]["sweep_dir"] == str(sweep)


def test_the_sweep_comes_from_the_saved_config_when_no_meta_is_given(tmp_path):
    job = tmp_path / "100-x" / "0"
    job.mkdir(parents=True)
    (job / "config_resolved.yaml").write_text(
        "strategy: {name: ddp}\ntrainer: {devices: 2, num_nodes: 1}\ndata: {global_batch_size: 16}\n"
        f"job: {{name: 100-x/0, sweep_dir: {tmp_path / '100-x'}}}\n")
    rec = slurm_jobs.finalize(job, STATE, "100_0")
    assert (rec["strategy"], rec["world_size"], rec["job"]["sweep_dir"]) == ("ddp", 2, str(tmp_path / "100-x"))
    single = tmp_path / "solo"
    single.mkdir()
    assert slurm_jobs.finalize(single, STATE, "101")["job"]["sweep_dir"] is None     # nothing saved: no sweep named


def test_a_cancelled_job_is_not_said_to_come_back_and_its_log_is_named(tmp_path):
    """`scancel 22` of a sweep's job: its ranks' SIGTERM line said "SLURM ends or requeues job 22
    itself (a requeued job resumes from it)", and the launcher, knowing it CANCELLED, passed it on."""
    job = tmp_path / "1"
    job.mkdir()
    (job / "run.json").write_text(json.dumps({
        "status": "failed", "strategy": "fsdp", "slurm": {"job_id": "22"},
        "error": "stopped by SIGTERM: checkpoint saved at step 8; SLURM ends or requeues job 22 itself (a requeued "
                 "job resumes from it)"}))
    log = tmp_path / "slurm" / "scalelab-22.out"
    rec = slurm_jobs.finalize(job, {"state": "CANCELLED", "reason": "CANCELLED by 0"}, "22", log=log)
    assert rec["error"] == ("SLURM CANCELLED (CANCELLED by 0): stopped by SIGTERM: checkpoint saved at step 8; SLURM "
                            "ended the job (CANCELLED), so it is not requeued: the same command (a sweep: with "
                            f"hydra.sweep.dir set to its folder) goes on from that checkpoint; log: {log}")
    # a job that left no record names its log where it said "see the job's sbatch log"
    solo = tmp_path / "solo"
    solo.mkdir()
    bare = slurm_jobs.finalize(solo, STATE, "23", log=tmp_path / "scalelab-23.out")
    assert bare["error"].endswith(f"without a run record; see {tmp_path / 'scalelab-23.out'}")


def test_a_stopped_jobs_loss_so_far_is_the_mean_of_its_ranks_kept_curves(tmp_path):
    """A cancelled job's record had steps 8 and no loss, its 8 losses beside its checkpoint; the
    record's curve is the mean over ranks per step: (5.0 + 6.0) / 2 = 5.5, (4.0 + 5.0) / 2 = 4.5."""
    from scalelab.checkpointing import curve_path, mean_curve

    ckpt = tmp_path / "step-00000002.ckpt"
    for rank, losses in enumerate(([5.0, 4.0], [6.0, 5.0])):
        curve_path(ckpt, rank).write_text(json.dumps({"global_steps": [1, 2], "losses": losses}))
    assert mean_curve(ckpt, 2) == [[1, 5.5], [2, 4.5]]
    assert mean_curve(ckpt, 3) is None          # a rank's curve missing: no figure rather than a partial mean


def test_wait_says_a_job_was_requeued():
    from scalelab.slurm import _requeued

    assert _requeued({"slurm": {"requeues": 1}, "resumed_at_step": 9}) == "; requeued 1x, resumed at step 9"
    assert _requeued({"slurm": {"requeues": 2}}) == "; requeued 2x"
    assert _requeued({"slurm": {"requeues": 0}}) == _requeued(None) == ""

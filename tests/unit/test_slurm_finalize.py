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

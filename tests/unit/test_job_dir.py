"""A job's folder that holds another job's run is refused (nothing written there); an earlier run of
the same job is resumed or, completed, kept (scalelab.job_dir; preflight names the folders it can)."""
import json

import pytest
import yaml

from scalelab import job_dir
from scalelab.errors import ConfigError
from scalelab.preflight import preflight


def _occupy(d, overrides, record=True, checkpoints=False):
    d.mkdir(parents=True, exist_ok=True)
    (d / "config_resolved.yaml").write_text(yaml.safe_dump({"job": {"overrides": overrides}}))
    if record:
        (d / "run.json").write_text(json.dumps({"status": "completed"}))
    if checkpoints:
        (d / "checkpoints").mkdir()


def test_another_job_s_run_is_refused_naming_the_folder_and_the_differing_values(tmp_path):
    _occupy(tmp_path, ["strategy=ddp", "optim.lr=0.1"])
    line = job_dir.refusal(tmp_path, ["strategy=fsdp", "optim.lr=0.1"])
    assert line.startswith(f"{tmp_path} holds another job's run (run.json; there vs now: strategy: ddp vs fsdp)")
    assert "\n" not in line and "hydra.sweep.dir" in line
    # an override only one of them has: '-' for the other
    assert "optim.lr: 0.1 vs -" in job_dir.refusal(tmp_path, ["strategy=ddp"])


def test_the_same_job_again_is_not_refused(tmp_path):
    _occupy(tmp_path, ["strategy=ddp", "optim.lr=0.1"], checkpoints=True)
    # another order, and keys free to differ: where it writes, what it prints, how it checkpoints,
    # how long it trains (the same run trained longer)
    again = ["optim.lr=0.1", "strategy=ddp", f"hydra.run.dir={tmp_path}", "verbose=true", "logger=csv",
             "checkpoint.every_n_steps=5", "trainer.max_restarts=2", "trainer.timeout_s=60", "trainer.max_steps=50"]
    assert job_dir.refusal(tmp_path, again) is None
    assert job_dir.same_job(again, ["strategy=ddp", "optim.lr=0.1"])
    assert not job_dir.same_job(again, ["strategy=ddp", "optim.lr=0.2"])


def test_a_folder_with_nothing_to_lose_or_no_earlier_config_is_not_refused(tmp_path):
    assert job_dir.refusal(tmp_path, ["strategy=ddp"]) is None                  # empty
    _occupy(tmp_path, ["strategy=fsdp"], record=False)                          # failed before any record
    assert job_dir.refusal(tmp_path, ["strategy=ddp"]) is None
    (tmp_path / "checkpoints").mkdir()                                          # ... but it left checkpoints
    assert "(checkpoints;" in job_dir.refusal(tmp_path, ["strategy=ddp"])
    (tmp_path / "config_resolved.yaml").write_text(": not yaml [")            # unreadable: whose is unknown
    assert job_dir.refusal(tmp_path, ["strategy=ddp"]) is None


def _record(status="completed", final=True, overrides=("strategy=ddp",)):
    return {"status": status, "job": {"overrides": list(overrides)}, "config": {"trainer": {"max_steps": 20}},
            "timing": {"marks": {"ranks_exited": 12.0} if final else {}}}


def test_a_completed_record_of_the_same_job_is_kept():
    assert job_dir.completed_here(_record(), ["strategy=ddp", "hydra.sweep.dir=/x"], 20)
    assert not job_dir.completed_here(_record(status="failed"), ["strategy=ddp"], 20)
    assert not job_dir.completed_here(_record(final=False), ["strategy=ddp"], 20)     # rank 0's part only
    assert not job_dir.completed_here(_record(), ["strategy=fsdp"], 20)
    assert not job_dir.completed_here(_record(), ["strategy=ddp", "trainer.max_steps=30"], 30)  # train it longer
    assert not job_dir.completed_here(None, ["strategy=ddp"], 20)


def test_preflight_refuses_a_sweep_into_a_folder_of_another_sweep_before_any_job(tmp_path):
    sweep = tmp_path / "sweep"
    args = ["-m", "strategy=single", "optim.lr=0.1,0.2", f"hydra.sweep.dir={sweep}"]
    # Hydra numbers the jobs 0, 1 in sweep order: folder 1 held optim.lr=0.2 before
    _occupy(sweep / "0", ["strategy=single", "optim.lr=0.1"])
    _occupy(sweep / "1", ["strategy=single", "optim.lr=0.2"])
    assert preflight(args, data=False) == 2                                     # the same sweep again
    _occupy(sweep / "1", ["strategy=single", "optim.lr=0.3"])
    with pytest.raises(ConfigError, match=rf"^{sweep / '1'} holds another job's run \(run.json; there vs now: "
                                          r"optim.lr: 0.3 vs 0.2\)"):
        preflight(args, data=False)
    # a run dir: the same
    run = tmp_path / "run"
    _occupy(run, ["strategy=ddp"], record=False, checkpoints=True)
    with pytest.raises(ConfigError, match="strategy: ddp vs single"):
        preflight(["strategy=single", f"hydra.run.dir={run}"], data=False)
    # the default folders are named by the time: new, not looked at
    assert preflight(["strategy=single"], data=False) == 1

"""A job's folder that holds another job's run is refused (nothing written there); an earlier run of
the same job is resumed or, completed, kept (scalelab.job_dir; preflight names the folders it can).
"The same job" is the same resolved config, its free keys apart (where it writes, what it logs, how
it checkpoints, how long it trains)."""
import copy

import pytest
import yaml

from scalelab import job_dir
from scalelab.errors import ConfigError
from scalelab.preflight import preflight

CFG = {"seed": 1234, "strategy": {"name": "ddp", "_target_": "scalelab.strategies.ddp.DDP"},
       "optim": {"name": "sgd", "lr": 0.1}, "trainer": {"devices": 2, "max_steps": 20, "timeout_s": 600},
       "logger": {"name": "none"}, "launcher": {"name": "local"}, "cache_dir": "/c", "verbose": False,
       "checkpoint": {"every_n_steps": None}, "job": {"name": "a/0", "overrides": ["strategy=ddp"]}}


def _cfg(**changes):
    cfg = copy.deepcopy(CFG)
    for key, value in changes.items():
        node, *path = key.split("__")
        if not path:
            cfg[node] = value
            continue
        target = cfg[node]
        for part in path[:-1]:
            target = target[part]
        target[path[-1]] = value
    return cfg


def _occupy(d, cfg, record=True, checkpoints=False):
    d.mkdir(parents=True, exist_ok=True)
    (d / "config_resolved.yaml").write_text(yaml.safe_dump(cfg))
    if record:
        (d / "run.json").write_text("{}")
    if checkpoints:
        (d / "checkpoints").mkdir()


def test_another_job_s_run_is_refused_naming_the_folder_and_the_differing_values(tmp_path):
    _occupy(tmp_path, CFG)
    line = job_dir.refusal(tmp_path, _cfg(optim__lr=0.2))
    assert line.startswith(f"{tmp_path} holds another job's run (run.json; there vs now: optim.lr: 0.1 vs 0.2)")
    assert "\n" not in line and "hydra.sweep.dir" in line and "a new --name" in line
    # a key only one of them has: '-' for the other
    assert "optim.momentum: - vs 0.9" in job_dir.refusal(tmp_path, _cfg(optim={"name": "sgd", "lr": 0.1,
                                                                                  "momentum": 0.9}))


def test_the_same_job_again_is_not_refused(tmp_path):
    _occupy(tmp_path, CFG, checkpoints=True)
    # keys free to differ: where it writes and what it prints or logs, how it checkpoints and
    # restarts, how long it trains, its own job fields (name, overrides as typed)
    again = _cfg(trainer__timeout_s=60, trainer__max_steps=50, logger={"name": "csv"}, verbose=True,
                 cache_dir="/d", launcher={"name": "srun"}, checkpoint={"every_n_steps": 5},
                 job={"name": "b/3", "overrides": ["strategy=ddp", "optim.lr=1e-1"]})
    assert job_dir.refusal(tmp_path, again) is None
    assert job_dir.differences(CFG, again) == []
    assert job_dir.differences(CFG, _cfg(seed=1)) == ["seed: 1234 vs 1"]


def test_a_folder_with_nothing_to_lose_or_no_earlier_config_is_not_refused(tmp_path):
    other = _cfg(strategy={"name": "fsdp", "_target_": "scalelab.strategies.fsdp.FSDP"})
    assert job_dir.refusal(tmp_path, CFG) is None                             # empty
    _occupy(tmp_path, other, record=False)                                    # failed before any record
    assert job_dir.refusal(tmp_path, CFG) is None
    (tmp_path / "checkpoints").mkdir()                                        # ... but it left checkpoints
    assert "(checkpoints; there vs now: strategy: fsdp vs ddp)" in job_dir.refusal(tmp_path, CFG)
    (tmp_path / "config_resolved.yaml").write_text(": not yaml [")          # unreadable: whose is unknown
    assert job_dir.refusal(tmp_path, CFG) is None


def test_a_secret_saved_redacted_is_still_the_same_job(tmp_path):
    cfg = _cfg(logger={"name": "wandb"}, data={"hub_token": "hf_abcdefghijklmnop"})
    saved = _cfg(logger={"name": "wandb"}, data={"hub_token": "<redacted>"})
    _occupy(tmp_path, saved)
    assert job_dir.refusal(tmp_path, cfg) is None


def _record(status="completed", final=True, cfg=CFG):
    return {"status": status, "config": {k: v for k, v in cfg.items() if k != "job"},
            "timing": {"marks": {"ranks_exited": 12.0} if final else {}}}


def test_a_completed_record_of_the_same_job_is_kept():
    assert job_dir.completed_here(_record(), _cfg(verbose=True))
    assert not job_dir.completed_here(_record(status="failed"), CFG)
    assert not job_dir.completed_here(_record(final=False), CFG)               # rank 0's part only
    assert not job_dir.completed_here(_record(), _cfg(optim__lr=0.2))
    assert not job_dir.completed_here(_record(), _cfg(trainer__max_steps=30))  # train it longer
    assert not job_dir.completed_here(None, CFG)


def test_preflight_refuses_a_sweep_into_a_folder_of_another_sweep_before_any_job(tmp_path):
    from hydra import compose, initialize_config_dir
    from omegaconf import OmegaConf

    from scalelab.paths import conf_dir

    def resolved(*overrides):
        with initialize_config_dir(config_dir=str(conf_dir()), version_base="1.3"):
            return OmegaConf.to_container(compose("train", overrides=list(overrides)), resolve=True)

    sweep = tmp_path / "sweep"
    args = ["-m", "strategy=single", "optim.lr=0.1,0.2", f"hydra.sweep.dir={sweep}"]
    # Hydra numbers the jobs 0, 1 in sweep order: folder 1 held optim.lr=0.2 before
    _occupy(sweep / "0", resolved("strategy=single", "optim.lr=0.1"))
    _occupy(sweep / "1", resolved("strategy=single", "optim.lr=2e-1"))
    assert preflight(args, data=False) == 2                                     # the same sweep again
    _occupy(sweep / "1", resolved("strategy=single", "optim.lr=0.3"))
    with pytest.raises(ConfigError, match=rf"^{sweep / '1'} holds another job's run \(run.json; there vs now: "
                                          r"optim.lr: 0.3 vs 0.2\)"):
        preflight(args, data=False)
    # a run dir: the same
    run = tmp_path / "run"
    _occupy(run, resolved("strategy=ddp"), record=False, checkpoints=True)
    with pytest.raises(ConfigError, match=r"there vs now: strategy: ddp vs single\)"):
        preflight(["strategy=single", f"hydra.run.dir={run}"], data=False)
    # the default folders are named by the time: new, not looked at
    assert preflight(["strategy=single"], data=False) == 1


def test_a_shorter_rerun_over_a_longer_run_is_refused(tmp_path):
    """Before, max_steps 40 -> 30 in the same folder replaced the completed record and keep_last
    pruned the new run's checkpoints (the old, later ones were the newest)."""
    import json

    _occupy(tmp_path, _cfg(trainer__max_steps=40), record=False)
    assert job_dir.refusal(tmp_path, CFG) is None                               # nothing there to lose
    (tmp_path / "run.json").write_text(json.dumps({"status": "failed"}))
    assert job_dir.refusal(tmp_path, CFG) is None                               # a failed run, no checkpoint
    ckpt = tmp_path / "checkpoints" / "step-00000030.ckpt"
    ckpt.parent.mkdir()
    ckpt.write_bytes(b"x")
    ckpt.with_name(ckpt.name + ".manifest.json").write_text(json.dumps({"step": 30, "files": {"": 1}}))
    assert job_dir.refusal(tmp_path, CFG) == (
        f"{tmp_path} holds a longer run of this job (trainer.max_steps=40: checkpoints to step 30): "
        "trainer.max_steps=20 would replace it; a shorter run needs a folder of its own (hydra.run.dir or "
        "hydra.sweep.dir)")
    (tmp_path / "run.json").write_text(json.dumps({"status": "completed"}))
    assert "(trainer.max_steps=40: its completed record and checkpoints to step 30)" in job_dir.refusal(tmp_path, CFG)
    assert job_dir.refusal(tmp_path, _cfg(trainer__max_steps=40)) is None        # the same length
    assert job_dir.refusal(tmp_path, _cfg(trainer__max_steps=60)) is None        # train it longer


def test_a_longer_rerun_without_a_checkpoint_to_go_on_from_is_refused(tmp_path):
    """Before, max_steps 20 -> 25 over a completed 20-step run without checkpoints trained again from
    step 0 and replaced the record without a word (the README says a larger max_steps trains longer)."""
    import json

    _occupy(tmp_path, CFG, record=False)
    (tmp_path / "run.json").write_text(json.dumps({"status": "completed"}))
    longer = _cfg(trainer__max_steps=25)
    assert job_dir.refusal(tmp_path, longer) == (
        f"{tmp_path} holds a completed run of this job to trainer.max_steps=20 and no checkpoint to go on from "
        "(checkpoint.every_n_steps=N saves them): trainer.max_steps=25 would train it again from step 0 and "
        "replace its record; give the longer run a folder of its own (hydra.run.dir or hydra.sweep.dir), or add "
        "checkpoint.resume=never to replace it")
    assert job_dir.refusal(tmp_path, _cfg(trainer__max_steps=25, checkpoint__resume="never")) is None
    ckpt = tmp_path / "checkpoints" / "step-00000020.ckpt"                      # saved: it goes on from there
    ckpt.parent.mkdir()
    ckpt.write_bytes(b"x")
    ckpt.with_name(ckpt.name + ".manifest.json").write_text(json.dumps({"step": 20, "files": {"": 1}}))
    assert job_dir.refusal(tmp_path, longer) is None
    (tmp_path / "run.json").write_text(json.dumps({"status": "failed"}))
    ckpt.unlink()
    assert job_dir.refusal(tmp_path, longer) is None                            # nothing completed to lose


def test_a_longer_rerun_that_names_its_checkpoint_or_is_a_node_s_record_is_not_refused(tmp_path):
    """checkpoint.resume_from goes on from the checkpoint it names (the README's way to continue a
    run saved with checkpoint.save=true: last.ckpt, which resume=auto does not read); a node's own
    record (launcher=torchrun, node >= 1, no checkpoints there) is not the run: node 0 decides."""
    import json

    _occupy(tmp_path, CFG, record=False)
    (tmp_path / "run.json").write_text(json.dumps({"status": "completed"}))
    last = tmp_path / "checkpoints" / "last.ckpt"
    last.parent.mkdir()
    last.write_bytes(b"x")
    assert job_dir.refusal(tmp_path, _cfg(trainer__max_steps=25)).endswith(
        f"or add checkpoint.resume=never to replace it, or checkpoint.resume_from={last} to go on from its last step")
    assert job_dir.refusal(tmp_path, _cfg(trainer__max_steps=25, checkpoint__resume_from=str(last))) is None
    (tmp_path / "run.json").write_text(json.dumps({"status": "completed", "record_on_node": 0}))
    assert job_dir.refusal(tmp_path, _cfg(trainer__max_steps=25)) is None


def test_a_continued_run_may_measure_with_another_warm_up(tmp_path):
    """A 5-step run's warm-up is lowered to 4 (config.smoke_warmup); the same job continued to 10
    steps has the default 5 and was refused over it ('trainer.warmup_steps: 4 vs 5'), a value the
    user never set. What a run measures is free between lengths; at one length it is still the job."""
    short = _cfg(trainer__max_steps=5)
    short["trainer"].update(warmup_steps=4, profile_steps=0)
    _occupy(tmp_path, short, checkpoints=True)
    longer = _cfg(trainer__max_steps=10)
    longer["trainer"].update(warmup_steps=5, profile_steps=3)
    assert job_dir.refusal(tmp_path, longer) is None
    same_length = copy.deepcopy(short)
    same_length["trainer"]["warmup_steps"] = 2
    assert "trainer.warmup_steps: 4 vs 2" in job_dir.refusal(tmp_path, same_length)
    # what it trains is still compared between lengths
    assert "optim.lr: 0.1 vs 0.2" in job_dir.refusal(tmp_path, {**longer, "optim": {"name": "sgd", "lr": 0.2}})

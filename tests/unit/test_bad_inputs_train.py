"""scalelab-train's bad command lines that got past preflight: each is one ConfigError line before
any job starts (exit 2), and no folder that holds runs is written into."""
import json

import pytest

from scalelab.errors import ConfigError
from scalelab.preflight import preflight


def _refused(args, match):
    with pytest.raises(ConfigError, match=match) as e:
        preflight(args, data=False)
    assert "\n" not in str(e.value)
    return str(e.value)


def test_an_empty_sweep_is_refused(tmp_path):
    """Before: "Launching 0 jobs locally", exit 0, and the sweep folder's multirun.yaml, sweep.json
    and report.html rewritten."""
    _refused(["-m", "trainer.devices=range(2,1)", f"hydra.sweep.dir={tmp_path}"],
             r"^the sweep expands to 0 jobs \(trainer.devices=range\(2,1\) is empty\)")
    assert list(tmp_path.iterdir()) == []


def _sweep(folder):
    (folder / "0").mkdir(parents=True)
    (folder / "multirun.yaml").write_text("hydra: {}\n")
    (folder / "0" / "run.json").write_text("{}")
    return folder


def _run(folder):
    folder.mkdir(parents=True)
    (folder / "run.json").write_text("{}")
    (folder / "config_resolved.yaml").write_text("strategy: {name: single}\n")
    return folder


def test_a_run_into_a_sweep_s_folder_is_refused(tmp_path):
    sweep = _sweep(tmp_path / "sweep")
    line = _refused(["strategy=single", f"hydra.run.dir={sweep}"], rf"^hydra.run.dir={sweep} is a sweep's folder")
    assert "multirun.yaml and job records 0/run.json" in line, line
    (sweep / "multirun.yaml").unlink()           # the job records alone mark it too
    _refused(["strategy=single", f"hydra.run.dir={sweep}"], r"is a sweep's folder \(it holds job records 0/run.json\)")


def test_a_sweep_into_a_run_s_folder_is_refused(tmp_path):
    run = _run(tmp_path / "run")
    _refused(["-m", "strategy=single", f"hydra.sweep.dir={run}"],
             rf"^hydra.sweep.dir={run} is a single run's folder \(it holds run.json and config_resolved.yaml\)")


def test_each_kind_of_folder_still_takes_its_own_kind(tmp_path):
    """A sweep run again into its folder, a run into a new one: no refusal of the folder's kind."""
    sweep = _sweep(tmp_path / "sweep")
    assert preflight(["-m", "strategy=single", f"hydra.sweep.dir={sweep}", "hydra.sweep.subdir=new"], data=False) == 1
    assert preflight(["strategy=single", f"hydra.run.dir={tmp_path / 'new'}"], data=False) == 1


def test_jobs_of_a_sweep_in_one_folder_are_refused():
    """Before: job 0 ran, Hydra then overwrote its .hydra/ for job 1, which was refused (rc 1)."""
    _refused(["-m", "strategy=single,ddp", "hydra.sweep.subdir=same"],
             r"^hydra.sweep.subdir=same puts jobs 0 \(strategy=single\) and 1 \(strategy=ddp\) in one folder "
             r"\(hydra.sweep.dir/same\): give each job its own")
    assert preflight(["-m", "strategy=single,ddp", "hydra.sweep.subdir=${hydra.job.override_dirname}"],
                     data=False) == 2


def test_an_override_without_a_key_is_one_line():
    _refused(["=5"], r"^'=5' has no key: an override is KEY=VALUE")   # was a ValueError traceback


def test_a_glob_sweep_is_matched_against_the_group_s_options():
    """Before: "HydraException: ConfigLoader is not set" (a traceback)."""
    assert preflight(["-m", "strategy=glob(sing*)"], data=False) == 1
    _refused(["-m", "strategy=glob(nosuch*)"], r"^strategy=glob\(nosuch\*\) matches no strategy: choose among .*ddp")


def test_an_optuna_search_space_is_validated_value_by_value():
    """Before: each trial failed in its job with a ConfigError traceback (67 lines)."""
    base = ["-m", "experiment=lr_search", "logger=none"]
    _refused([*base, "optim.lr=choice(-1,-2)"],
             r"^optim.lr=-1 must be a number > 0.* \[search space: optim.lr=choice\(-1,-2\)\]$")
    _refused([*base, "optim.lr=interval(0,0.1)"], r"^optim.lr=0.0 must be a number > 0")   # a bound
    _refused([*base, "lr_scaling.warmup_steps=choice(0,100)"], r"lr_scaling.warmup_steps=100 is more than")
    assert preflight(base, data=False) == 1


def test_a_search_space_with_valid_combinations_is_not_refused():
    """Each searched value alone, the others at their defaults, refused valid trials: batch 16
    does not divide by 3 ranks, though batches 6 and 12 do. A value no combination makes valid
    still is."""
    base = ["-m", "hydra/sweeper=optuna", "strategy=ddp", "logger=none"]
    assert preflight([*base, "trainer.devices=choice(1,3)", "data.global_batch_size=choice(6,12)"], data=False) == 1
    _refused([*base, "trainer.devices=choice(1,3)", "data.global_batch_size=choice(8,16)"],
             r"does not divide.*\[search space: ")


def test_a_config_error_in_a_job_is_a_failed_job_not_a_traceback(monkeypatch, tmp_path):
    from hydra import compose, initialize_config_dir
    from hydra.core.global_hydra import GlobalHydra
    from hydra.core.hydra_config import HydraConfig
    from omegaconf import open_dict

    from scalelab import train
    from scalelab.paths import conf_dir

    GlobalHydra.instance().clear()
    with initialize_config_dir(config_dir=str(conf_dir()), version_base="1.3"):
        cfg = compose("train", overrides=[f"hydra.sweep.dir={tmp_path}"], return_hydra_config=True)
    GlobalHydra.instance().clear()
    with open_dict(cfg):
        cfg.hydra.mode, cfg.hydra.job.num, cfg.hydra.runtime.output_dir = "MULTIRUN", 3, str(tmp_path / "3")
    HydraConfig.instance().set_config(cfg)

    def bad(_):
        raise ConfigError("optim.lr=-1 must be a number > 0")

    failed = []
    monkeypatch.setattr(train, "run_job", bad)
    monkeypatch.setattr(train, "_FAILED", failed)
    assert train._hydra_main(cfg) is None     # Optuna's objective: a failed trial (the sweeper records FAIL)
    assert failed == [f"{tmp_path.name}/3: optim.lr=-1 must be a number > 0"]


@pytest.mark.parametrize("what", ["run.json", "truncated", "zip"])
def test_resume_from_a_file_that_is_no_checkpoint_is_one_line(tmp_path, what):
    """Before: a rank was spawned and failed ("mmap can only be used with files saved with torch.save")."""
    import zipfile

    import torch

    ckpt = tmp_path / "last.ckpt"
    if what == "run.json":
        ckpt = tmp_path / "run.json"
        ckpt.write_text(json.dumps({"status": "completed"}))
    elif what == "truncated":
        torch.save({"state_dict": {"w": torch.zeros(1000)}}, ckpt)
        ckpt.write_bytes(ckpt.read_bytes()[:2000])
    else:                                        # a zip, but not torch.save's
        with zipfile.ZipFile(ckpt, "w") as z:
            z.writestr("notes.txt", "x")
    _refused(["model=gpt_nano", f"checkpoint.resume_from={ckpt}"],
             rf"^checkpoint.resume_from='{ckpt}' is not a checkpoint file \(torch.save's zip archive")


def test_resume_from_a_torch_checkpoint_file_passes(tmp_path):
    import torch

    ckpt = tmp_path / "last.ckpt"
    torch.save({"state_dict": {"w": torch.zeros(4)}}, ckpt)
    assert preflight(["model=gpt_nano", f"checkpoint.resume_from={ckpt}"], data=False) == 1


@pytest.mark.parametrize("args,line", [
    (["-m", "hydra/launcher=nope"], "hydra/launcher=nope is not known: choose one of basic, slurm, submitit_local, "
                                    "submitit_slurm"),
    (["-m", "experiment=default", "hydra.sweeper.params.strategy=zzz"],
     "strategy=zzz is not known: choose one of ddp, ddp_compress, "),
])
def test_an_unknown_option_names_every_valid_one(args, line):
    """Before, the line was cut after "Available options in 'hydra/launcher':"."""
    assert _refused(args, "is not known").startswith(line)


def test_lr_warmup_longer_than_the_run_is_refused():
    """Before: silently cut to trainer.max_steps (scaling.lr.build_scheduler)."""
    _refused(["lr_scaling=linear", "lr_scaling.warmup_steps=100", "trainer.max_steps=30"],
             r"^lr_scaling.warmup_steps=100 is more than trainer.max_steps=30: .*give at most 30 steps")
    for ok in ("30", "0.5"):
        assert preflight(["lr_scaling=linear", f"lr_scaling.warmup_steps={ok}", "trainer.max_steps=30"],
                         data=False) == 1


def test_the_objective_a_sweeper_gets_is_the_final_loss_or_none():
    """scalelab.train's and the SLURM launcher's return value (review 2026-12-04: the SLURM launcher still
    returned NaN for a failed job, which ended an Optuna search at its first failed trial)."""
    from scalelab.results.optuna_trials import objective

    assert objective({"status": "completed", "loss": {"final": 3.25}}) == 3.25
    assert objective({"status": "failed", "loss": {"final": 3.25}}) is None      # failed after its record
    assert objective({"status": "completed", "loss": {"final": None}}) is None   # diverged: no final loss
    assert objective({"status": "completed", "loss": {"final": float("nan")}}) is None
    assert objective({"status": "failed"}) is None

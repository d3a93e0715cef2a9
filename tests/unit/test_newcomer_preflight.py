"""A newcomer's slips at `scalelab-train` (found by review): each is one line naming the bad value
and what is valid, exit 2, before anything is spawned; a smoke run with few steps just runs; and
the commands that run no job (--help, --cfg) leave no ranks' fork server behind."""
from __future__ import annotations

import signal
import sys

import pytest

from scalelab import spawn, train
from scalelab.errors import ConfigError
from scalelab.preflight import preflight


def _refused(args: list[str], *needed: str) -> str:
    with pytest.raises(ConfigError) as e:
        preflight(args, data=False)
    line = str(e.value)
    assert "\n" not in line and "Traceback" not in line, line
    for text in needed:
        assert text in line, (text, line)
    return line


# ------------------------------------------------------------- 1. a typo of a key or a group
def test_a_group_typo_is_not_offered_as_a_new_key():
    """`strategi=fsdp` was told "... a new key is added with +strategi=VALUE"; following it trained ddp."""
    line = _refused(["strategi=fsdp"], "strategi", "did you mean strategy?")
    assert "+strategi" not in line and "new key" not in line
    line = _refused(["experimnt=default"], "did you mean experiment?")   # a group the config holds no key of
    assert "+experimnt" not in line


@pytest.mark.parametrize("override, near", [("+strategi=fsdp", "strategy=fsdp"), ("+seeed=3", "seed=3"),
                                            ("++seeed=3", "seed=3"), ("+modle=gpt_small", "model=gpt_small")])
def test_a_new_top_level_key_that_misspells_a_known_one_is_refused(override, near):
    """`+strategi=fsdp` passed and trained the default ddp; `+seeed=3` ran with seed 1234."""
    _refused([override], override, f"({near})", "did you mean")
    _refused(["-m", override, "trainer.devices=1,2"], override)   # in a sweep too


def test_new_keys_of_their_own_and_nested_additions_still_work():
    assert preflight(["+note=first_try", "+secret_token=abc123", "+logger.api_key=XyZ"], data=False) == 1
    assert preflight(["optim=sgd", "optim.optimizer.momentum=0.9", "+optim.optimizer.nesterov=true"], data=False) == 1
    _refused(["+trainer.max_step=10"], "did you mean trainer.max_steps?")       # closed groups as before
    line = _refused(["optim=sgd", "optim.optimizer.nesterov=true"])             # no near key: + is the way
    assert "a new key is added with +optim.optimizer.nesterov=VALUE" in line


# ------------------------------------------------------------- 2. a smoke run under the default warm-up
@pytest.mark.parametrize("steps", [1, 3, 5])
def test_a_smoke_run_under_the_default_warmup_is_not_refused(steps):
    """`trainer.max_steps=5` was refused: "trainer.warmup_steps=5 must be < trainer.max_steps=5"."""
    assert preflight([f"trainer.max_steps={steps}"], data=False) == 1
    assert preflight(["-m", f"trainer.max_steps={steps}", "trainer.devices=1,2"], data=False) == 2


def test_the_default_warmup_is_lowered_and_said_in_one_line():
    from hydra import compose, initialize_config_dir
    from hydra.core.global_hydra import GlobalHydra

    from omegaconf import OmegaConf

    from scalelab.config import smoke_warmup, validate, warmup_given, warmup_when_longer
    from scalelab.paths import conf_dir

    GlobalHydra.instance().clear()
    with initialize_config_dir(config_dir=str(conf_dir()), version_base="1.3"):
        cfg = compose("train", overrides=["trainer.max_steps=3"])
        long_run = compose("train")
    GlobalHydra.instance().clear()
    line = smoke_warmup(cfg, warmup_given(["trainer.max_steps=3"]))
    assert cfg.trainer.warmup_steps == 2 and "\n" not in line
    assert "trainer.max_steps=3" in line and "trainer.warmup_steps=5" in line and "trainer.warmup_steps=2" in line
    validate(cfg)   # the lowered config is a valid job
    assert smoke_warmup(long_run, False) is None and long_run.trainer.warmup_steps == 5
    # the end-of-run hint: 0 resumed + 5 warm-up (the default again once max_steps > 5) + 5 measured = 10;
    # it said 2 + 5 = 7, and 7 steps then asked for 10
    assert warmup_when_longer(cfg) == 5 and warmup_when_longer(long_run) == 5
    given = OmegaConf.create({"trainer": {"max_steps": 20, "warmup_steps": 1}})
    assert warmup_when_longer(given) == 1
    assert warmup_given(["trainer.warmup_steps=5"]) and warmup_given(["+trainer.warmup_steps=5"])


@pytest.mark.parametrize("steps, fix", [(5, "set trainer.warmup_steps=4 or less"), (1, "set trainer.warmup_steps=0")])
def test_a_warmup_the_user_gave_is_refused_with_its_fix(steps, fix):
    _refused([f"trainer.max_steps={steps}", f"trainer.warmup_steps={steps}"],
             f"trainer.warmup_steps={steps} must be < trainer.max_steps={steps}", fix)


# ------------------------------------------------------------- 3. a sweep whose values cannot be listed
def test_a_range_with_step_zero_is_one_line():
    """`-m seed=range(1,4,0)`: a ValueError traceback, exit 1."""
    _refused(["-m", "seed=range(1,4,0)"], "'seed=range(1,4,0)'", "step is 0", "seed=range(1,4)")


# ------------------------------------------------------------- 5. bad sweep syntax
@pytest.mark.parametrize("override, why, example", [
    ("strategy=ddp,,fsdp", "an empty value between two commas", "strategy=a,b"),   # was: no reason
    ("strategy=ddp,fsdp,", "ends with a comma", "strategy=a,b"),                     # was: no override
    ("strategy=[ddp", "'[' is not closed", "strategy=[a,b]"),                      # was: "no viable alternative"
    ("seed=range(1,x)", "range(1,x)", "seed=range(1,4)"),
])
def test_bad_sweep_syntax_names_the_override_why_and_a_valid_form(override, why, example):
    line = _refused(["-m", override], f"'{override}': ", why, f"e.g. {example}")
    assert "expecting" not in line and "BRACKET_OPEN" not in line and "<EOF>" not in line


# ------------------------------------------------------------- 4. --cfg / --info
@pytest.mark.parametrize("args, needed", [
    (["--cfg", "job", "strategy=fsdpp"], "strategy=fsdpp is not known: choose one of"),   # was Hydra's 25 lines
    (["--cfg", "job", "trainer.devices=0"], "trainer.devices=0 must be an integer >= 1"),  # was printed, exit 0
    (["--cfg", "all", "trainer.max_step=3"], "did you mean trainer.max_steps?"),
    (["--info", "defaults", "+seeed=3"], "did you mean seed?"),
])
def test_cfg_and_info_refuse_an_unknown_option_key_or_value(args, needed):
    _refused(args, needed)


def test_cfg_checks_no_cross_key_rule_and_prepares_no_data():
    assert preflight(["--cfg", "job", "trainer.max_steps=2", "trainer.warmup_steps=5"]) == 0
    assert preflight(["--cfg", "hydra", "-p", "hydra.run", "hydra.run.dir=/tmp/x"]) == 0
    assert preflight(["--info", "strategy=fsdp"]) == 0


# ------------------------------------------------------------- 6. no fork server left behind
@pytest.fixture
def main_calls(monkeypatch):
    """train.main in this process: the fork server's start and stop recorded, not run."""
    calls: list[str] = []
    monkeypatch.setattr(spawn, "start_server", lambda *a, **k: calls.append("start"))
    monkeypatch.setattr(spawn, "stop_server", lambda: calls.append("stop"))
    monkeypatch.setattr(signal, "signal", lambda *a: None)
    monkeypatch.setattr(train, "install_log_redaction", lambda: None)
    monkeypatch.setattr(train, "_fast_exit", lambda code: sys.exit(code))

    def run(*argv: str, hydra_exit: int | None = None) -> int:
        if hydra_exit is not None:   # Hydra's --help, --cfg and its own errors: sys.exit inside _hydra_main
            monkeypatch.setattr(train, "_hydra_main", lambda: sys.exit(hydra_exit))
        monkeypatch.setattr(sys, "argv", ["scalelab-train", *argv])
        with pytest.raises(SystemExit) as done:
            train.main()
        return done.value.code

    return run, calls


@pytest.mark.parametrize("flag", ["--help", "--hydra-help", "--cfg", "-c", "--info", "--version", "-sc"])
def test_flags_that_run_no_job_start_no_fork_server(main_calls, monkeypatch, flag):
    import scalelab.preflight

    monkeypatch.setattr(scalelab.preflight, "preflight", lambda *a, **k: 0)
    run, calls = main_calls
    assert run(flag, hydra_exit=0) == 0
    assert "start" not in calls, calls


def test_a_hydra_exit_inside_the_app_stops_the_fork_server(main_calls, monkeypatch):
    import scalelab.preflight

    monkeypatch.setattr(scalelab.preflight, "preflight", lambda *a, **k: 1)
    run, calls = main_calls
    assert run("strategy=ddp", hydra_exit=1) == 1
    assert calls == ["start", "stop"], calls


def test_cfg_with_an_unknown_option_is_one_line_and_exit_2(main_calls, capsys):
    run, calls = main_calls
    assert run("--cfg", "job", "strategy=fsdpp") == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("error: strategy=fsdpp is not known") and "\n" not in err, err
    assert "start" not in calls


# ------------------------------------------------------------- review 2026-12-03: experiments and flags
def test_an_experiment_that_is_a_sweep_needs_dash_m():
    """`scalelab-train experiment=strategy_scaling` ran ddp at 1 rank, one of its 4 jobs, exit 0."""
    line = _refused(["experiment=strategy_scaling"], "experiment=strategy_scaling is a sweep (strategy=single,ddp "
                    "trainer.devices=1,2): run it with -m (scalelab-train -m experiment=strategy_scaling)")
    assert "without -m Hydra runs one job of it" in line
    assert preflight(["-m", "experiment=strategy_scaling"], data=False) == 4
    # two experiments swept together: Hydra reads one sweeper config, so 2 jobs ran, not 4 + 2
    _refused(["-m", "experiment=default,weak_scaling"], "experiment=default,weak_scaling: each experiment is a sweep "
             "of its own; run them one at a time")


@pytest.mark.parametrize("args, needed", [(["--foo"], "unknown option '--foo'"),
                                          (["--cfg", "jobb"], "--cfg jobb: --cfg takes one of job, hydra, all"),
                                          (["strategy=ddp", "--cfg"], "--cfg: --cfg takes one of job, hydra, all"),
                                          (["--multirn", "strategy=ddp,fsdp"], "unknown option '--multirn'")])
def test_an_unknown_flag_is_refused_before_any_data_is_prepared(args, needed, tmp_path, monkeypatch):
    """`scalelab-train --foo` prepared the data (31 MB into a fresh cache) before argparse refused it."""
    monkeypatch.setenv("SCALELAB_CACHE", str(tmp_path / "cache"))
    with pytest.raises(ConfigError) as e:
        preflight(args, data=True)
    assert needed in str(e.value) and "\n" not in str(e.value)
    assert not (tmp_path / "cache").exists()
    assert preflight(["--cfg", "job", "strategy=ddp"], data=True) == 0      # Hydra's flags still pass


def test_one_job_of_an_experiment_with_every_swept_key_given_passes():
    """The SLURM launcher runs each job of `-m experiment=X` as `python -m scalelab.train
    experiment=X strategy=... trainer.devices=...` (no -m; slurm/run.sbatch.template), and `slurm
    render` / `k8s render` take one job so: every swept key given is one job, not a sweep run once."""
    job = ["launcher=srun", "trainer.num_nodes=1", "experiment=strategy_scaling", "strategy=ddp", "trainer.devices=1"]
    assert preflight(job, data=False, elsewhere=True) == 1
    # one swept key left to the experiment: still a sweep run once
    _refused(["experiment=strategy_scaling", "strategy=ddp"], "experiment=strategy_scaling is a sweep "
             "(trainer.devices=1,2): run it with -m")


def test_a_launcher_key_of_the_wrong_type_says_why():
    """`hydra.launcher.cpus_per_task=abc` read "Error merging override ..." and nothing more."""
    _refused(["-m", "hydra/launcher=slurm", "hydra.launcher.cpus_per_task=abc", "strategy=ddp"],
             "hydra.launcher.cpus_per_task=abc", "Value 'abc' of type 'str' could not be converted to Integer")

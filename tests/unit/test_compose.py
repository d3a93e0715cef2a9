"""Every yaml in conf/ (and every experiment) composes, and validates where it is a full run."""

import pytest
from hydra import compose, initialize_config_dir
from hydra.core.global_hydra import GlobalHydra

from scalelab.config import validate
from scalelab.paths import conf_dir

CONF = conf_dir()
DEFAULT_GROUPS = {"strategy", "model", "data", "optim", "lr_scaling", "trainer", "logger", "launcher", "hardware",
                  "experiment"}
# Options that need a value only the user can give (a file list, a hub name).
NEEDS_USER_VALUE = {("data", "text_files"): ["data.files=[" + __file__ + "]"],
                    ("data", "hub"): ["data.hub_name=some/dataset"]}


def _options():
    for group_dir in sorted(p for p in CONF.iterdir() if p.is_dir()):
        for f in sorted(group_dir.glob("*.yaml")):
            yield group_dir.name, f.stem


@pytest.fixture()
def hydra_ctx():
    GlobalHydra.instance().clear()
    with initialize_config_dir(config_dir=str(CONF), version_base="1.3"):
        yield
    GlobalHydra.instance().clear()


@pytest.mark.parametrize("group,name", list(_options()), ids=lambda x: str(x))
def test_every_config_file_composes(hydra_ctx, group, name):
    prefix = "" if group in DEFAULT_GROUPS else "+"
    overrides = [f"{prefix}{group}={name}", *NEEDS_USER_VALUE.get((group, name), [])]
    if group == "strategy":
        overrides.append("trainer.devices=2")
    cfg = compose("train", overrides=overrides)   # (each compose ~0.3 s: no more of them than needed)
    if group == "experiment":  # a `# @package _global_` overlay: no key of its own
        # it sweeps something (Hydra's default sweeper has no params) and changes the run config
        hydra_cfg = compose("train", overrides=overrides, return_hydra_config=True).hydra
        assert hydra_cfg.sweeper.params, f"experiment={name} sets no hydra.sweeper.params"
        assert cfg != _default(), f"experiment={name} changes nothing"
    else:
        assert cfg[group] is not None
    if group in ("strategy", "model", "optim", "lr_scaling", "trainer", "logger", "experiment"):
        validate(cfg)


_DEFAULT = []


def _default():
    """The default job's config, composed once."""
    if not _DEFAULT:
        _DEFAULT.append(compose("train"))
    return _DEFAULT[0]


def test_experiments_folder_is_the_experiment_group():
    assert (CONF / "experiment").resolve() == (CONF.parent / "experiments").resolve()
    assert sorted(p.stem for p in (CONF.parent / "experiments").glob("*.yaml"))

"""The newcomer's path (review, 2026-12-03): a key of another option of a config group
(`data.hub_name=x` under the default data=stdlib) listed stdlib's keys and never said data=hub
has it; `scalelab --help` never said how to train, and `scalelab train` was only "invalid choice"."""
import pytest

from scalelab.errors import ConfigError
from scalelab.preflight import preflight

from ..conftest import run_cli


@pytest.mark.parametrize("args,line", [
    (["data.hub_name=roneneldan/TinyStories"], "data.hub_name is a key of data=hub, not of the data chosen: choose "
     "it too (data=hub data.hub_name=...)"),
    (["data.hub_config=x"], "data.hub_config is a key of data=hub"),     # null in hub.yaml: still its key
    (["data.files=[a.txt]"], "data.files is a key of data=text_files, not of the data chosen"),
    (["strategy.tensor_parallel_size=2"], "strategy.tensor_parallel_size is a key of strategy=fsdp_tp, strategy=tp, "
     "not of the strategy chosen: choose it too (strategy=fsdp_tp strategy.tensor_parallel_size=...)"),
    (["model.arch.in_features=3"], "model.arch.in_features is a key of model=mlp, not of the model chosen"),
])
def test_a_key_of_another_option_names_that_option(args, line):
    with pytest.raises(ConfigError) as e:
        preflight(args, data=False)
    assert str(e.value).startswith(line) and "\n" not in str(e.value)


def test_a_typo_still_gets_the_nearest_key():
    with pytest.raises(ConfigError) as e:
        preflight(["data.global_batch=8"], data=False)
    assert "did you mean data.global_batch_size?" in str(e.value) and "a key of data=" not in str(e.value)


def test_scalelab_help_says_how_to_train(capsys):
    code, cap = run_cli(["--help"], capsys)
    assert code == 0 and "To train (one run, or a sweep with -m): scalelab-train KEY=VALUE ..." in cap.out
    code, cap = run_cli(["train", "strategy=ddp"], capsys)
    assert code == 2 and cap.err.count("\n") == 1
    assert "invalid choice: 'train'" in cap.err and "; to train: scalelab-train KEY=VALUE ..." in cap.err


@pytest.mark.parametrize("args,line", [
    # with +, Hydra adds the key and the run trained the chosen option's data, the key unread
    (["+data.hub_name=roneneldan/TinyStories"], "data.hub_name is a key of data=hub, not of data=stdlib: choose it "
     "too (data=hub data.hub_name=...)"),
    (["+launcher.rdzv_endpoint=n0:29500"], "launcher.rdzv_endpoint is a key of launcher=torchrun, not of "
     "launcher=local"),
    (["data=hub", "data.hub_name=x", "+data.files=[a.txt]"], "data.files is a key of data=text_files, not of data=hub"),
])
def test_an_added_key_of_another_option_is_refused(args, line):
    with pytest.raises(ConfigError) as e:
        preflight(args, data=False)
    assert str(e.value).startswith(line) and "\n" not in str(e.value)

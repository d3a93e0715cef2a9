"""`scalelab plan`'s same-job line is a command the trainer accepts, and the flag form's precision
follows the hardware. Walkthrough: the README's `plan strategy=zero3 ... trainer.num_nodes=4`
printed a job without a launcher, which scalelab-train refuses ("trainer.num_nodes=4 needs
launcher=srun"); the flag form on `--hardware this_cpu` planned bf16-mixed where recommend and the
trainer use 32-true."""
from __future__ import annotations

import json
import shlex

import pytest

from scalelab.cli import build_parser
from scalelab.errors import ConfigError
from scalelab.preflight import preflight

NANO_FLAGS = ["--layers", "2", "--hidden", "64", "--heads", "4", "--vocab", "256", "--seq-len", "64",
              "--strategy", "ddp", "--devices", "2", "--global-batch", "32"]


def plan(capsys, *argv):
    args = build_parser().parse_args(["plan", *argv])
    code = args.func(args)
    out = capsys.readouterr()
    return code, out.out, out.err


def test_several_nodes_get_the_launcher_the_trainer_needs(capsys):
    job = ["strategy=ddp", "trainer.devices=2", "trainer.num_nodes=2"]
    with pytest.raises(ConfigError, match="needs launcher=srun"):     # as the walkthrough ran it
        preflight(job, data=False)
    code, out, err = plan(capsys, *job, "--json")
    assert code == 0, err
    command = json.loads(out)["train_command"]
    assert command == "scalelab-train strategy=ddp trainer.devices=2 trainer.num_nodes=2 launcher=srun"
    assert preflight(shlex.split(command)[1:], data=False) == 1         # the trainer's validation accepts it
    # one node: nothing added; a launcher named by the user: kept as given
    code, out, _ = plan(capsys, "strategy=ddp", "trainer.devices=2", "--json")
    assert code == 0 and "launcher" not in json.loads(out)["train_command"]
    code, out, _ = plan(capsys, *job, "launcher=torchrun", "--json")
    assert code == 0 and json.loads(out)["train_command"].endswith("trainer.num_nodes=2 launcher=torchrun")


def test_a_local_launcher_on_several_nodes_is_no_plan(capsys):
    code, _, err = plan(capsys, "strategy=ddp", "trainer.devices=2", "trainer.num_nodes=2", "launcher=local")
    assert code == 2 and err.count("\n") == 1
    assert "trainer.num_nodes=2 needs launcher=srun or launcher=torchrun" in err


@pytest.mark.parametrize("hardware,planned,trainer", [("this_cpu", "32", "32-true"),
                                                      ("h100_sxm", "bf16-mixed", "bf16-mixed")])
def test_flag_form_precision_follows_the_hardware(capsys, hardware, planned, trainer):
    code, out, err = plan(capsys, *NANO_FLAGS, "--hardware", hardware, "--json")
    assert code == 0, err
    doc = json.loads(out)
    assert doc["inputs"]["precision"] == planned
    assert f"trainer.precision={trainer}" in doc["train_command"]
    code, out, _ = plan(capsys, *NANO_FLAGS, "--hardware", hardware)
    assert f", {planned}, adam," in out.splitlines()[1]                 # the model line says it


def test_help_shows_the_precision_default(capsys):
    with pytest.raises(SystemExit):
        build_parser().parse_args(["plan", "--help"])
    text = " ".join(capsys.readouterr().out.split())
    assert "default: 32 on a CPU profile" in text and "bf16-mixed on a GPU one" in text

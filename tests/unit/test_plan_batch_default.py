"""`scalelab plan`'s flag form plans the trainer's default global batch, as the override form does.
Walkthrough: `plan --model gpt_small --strategy ddp --devices 2` planned global batch 2 (micro 1 x
dp 2) where `plan model=gpt_small strategy=ddp trainer.devices=2` planned 16 (the trainer's
data.global_batch_size), though the README says both forms give the same figures; the help of
--global-batch ("default dp x micro") and --micro-batch ("default: global batch / dp") named each
other."""
from __future__ import annotations

import json
import shutil

import pytest
import yaml

from scalelab.cli import build_parser
from scalelab.plan.base import conf_dir


def plan(capsys, *argv):
    args = build_parser().parse_args(["plan", *argv])
    code = args.func(args)
    out = capsys.readouterr()
    return code, out.out, out.err


def _trainer_batch() -> int:
    return yaml.safe_load((conf_dir() / "data" / "stdlib.yaml").read_text())["global_batch_size"]


def test_flag_form_plans_the_same_job_as_the_override_form(capsys):
    code, out, err = plan(capsys, "--model", "gpt_small", "--strategy", "ddp", "--devices", "2",
                          "--hardware", "this_cpu", "--json")
    assert code == 0, err
    flags = json.loads(out)
    code, out, err = plan(capsys, "model=gpt_small", "strategy=ddp", "trainer.devices=2",
                          "hardware_profile=this_cpu", "--json")
    assert code == 0, err
    overrides = json.loads(out)
    assert flags["inputs"]["parallel"]["global_batch"] == overrides["inputs"]["parallel"]["global_batch"] == _trainer_batch()
    assert flags["inputs"]["parallel"]["micro_batch"] == overrides["inputs"]["parallel"]["micro_batch"] == _trainer_batch() // 2
    assert flags["time"]["step_s"] == pytest.approx(overrides["time"]["step_s"])
    assert flags["memory"] == overrides["memory"]
    assert f"data.global_batch_size={_trainer_batch()}" in flags["train_command"]


def test_flag_form_default_batch_is_read_from_the_trainer_config(capsys, monkeypatch, tmp_path):
    conf = tmp_path / "conf"
    shutil.copytree(conf_dir(), conf)
    data = yaml.safe_load((conf / "data" / "stdlib.yaml").read_text())
    (conf / "data" / "stdlib.yaml").write_text(yaml.safe_dump({**data, "global_batch_size": 24}))
    monkeypatch.setenv("SCALELAB_CONF_DIR", str(conf))
    code, out, err = plan(capsys, "--model", "gpt_small", "--strategy", "ddp", "--devices", "2", "--json")
    assert code == 0, err
    assert json.loads(out)["inputs"]["parallel"]["global_batch"] == 24 and json.loads(out)["inputs"]["parallel"]["micro_batch"] == 12
    # a pipeline cuts the per-replica batch into its micro-batches, as the trainer (4 of them)
    code, out, err = plan(capsys, "--model", "gpt_small", "--strategy", "pipeline", "--devices", "2", "--json")
    assert code == 0, err
    layout = json.loads(out)["inputs"]["parallel"]
    assert layout["global_batch"] == 24 and layout["micro_batch"] * layout["micro_batches_per_step"] == 24


def test_a_default_batch_the_ranks_do_not_split_says_to_give_one(capsys):
    code, _, err = plan(capsys, "--model", "gpt_small", "--strategy", "ddp", "--devices", "3")
    assert code == 2 and err.count("\n") == 1
    assert f"data.global_batch_size, {_trainer_batch()}: give --global-batch" in err
    code, _, err = plan(capsys, "--model", "gpt_small", "--strategy", "ddp", "--devices", "3", "--global-batch", "24")
    assert code == 0, err
    # --micro-batch alone splits the trainer's default batch into accumulation steps
    code, out, err = plan(capsys, "--model", "gpt_small", "--strategy", "ddp", "--devices", "2",
                          "--micro-batch", "4", "--json")
    assert code == 0, err
    layout = json.loads(out)["inputs"]["parallel"]
    assert (layout["global_batch"], layout["micro_batch"], layout["micro_batches_per_step"]) == (_trainer_batch(), 4, 2)


def test_batch_help_is_not_circular():
    sub = next(a for a in build_parser()._actions if a.dest == "command").choices["plan"]
    helps = {a.dest: " ".join(a.help.split()) for a in sub._actions if a.dest in ("global_batch", "micro_batch")}
    assert f"data.global_batch_size, {_trainer_batch()}" in helps["global_batch"]
    assert "micro" not in helps["global_batch"]                  # the global batch's default does not need it
    assert "global batch / data-parallel ranks" in helps["micro_batch"]

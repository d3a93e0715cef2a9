"""`scalelab plan` refuses, one line exit 2, what it used to drop without a word: job flags beside the
override form (`plan strategy=ddp --devices 4` planned 1 device), shape flags beside --model
(`--model gpt_small --params 7B` planned 3.3M), a --tolerance that is not a finite number > 0
(nan passed every check), and flags its mode does not read (--out of a plan)."""
from __future__ import annotations

import json

import pytest

from ..conftest import run_cli


@pytest.mark.parametrize("flags,key", [
    (["--devices", "4"], "trainer.devices=N"),
    (["--global-batch", "64"], "data.global_batch_size=G"),
    (["--precision", "bf16-mixed"], "trainer.precision=P"),
    (["--nodes", "2"], "trainer.num_nodes=N"),
    (["--micro-batch", "2"], "data.micro_batch_size=B"),
    (["--optimizer", "sgd"], "optim=adamw|sgd"),
    (["--activation-checkpointing", "full"], "model.arch.activation_checkpointing="),
    (["--no-sequence-parallel"], "strategy.sequence_parallel=false"),
    (["--dropout", "0.1"], "model.arch.dropout=P"),
    (["--tp", "2"], "strategy.tensor_parallel_size=T"),
])
def test_job_flags_beside_overrides_are_refused(capsys, flags, key):
    code, cap = run_cli(["plan", "strategy=ddp", *flags], capsys)
    assert code == 2 and cap.err.count("\n") == 1, cap.err
    assert cap.err.startswith(f"error: {flags[0]} with scalelab-train overrides") and key in cap.err, cap.err


@pytest.mark.parametrize("argv,needle", [
    (["strategy=ddp", "trainer.devices=8", "--strategy", "fsdp"], "--strategy fsdp with strategy=ddp"),
    (["strategy=ddp", "--vocab", "100"], "--vocab with strategy=ddp"),
    (["--model", "gpt_small", "--params", "7B", "--strategy", "ddp"], "--model gpt_small with --params"),
    (["--model", "gpt_small", "--seq-len", "64", "--layers", "2", "--strategy", "ddp"], "with --layers, --seq-len"),
    (["--params", "1B", "--strategy", "ddp", "--out", "plan.yaml"], "--out plan.yaml: only --probe and --calibrate"),
    (["--params", "1B", "--strategy", "ddp", "--tolerance", "0.1"], "--tolerance 0.1: it is the pass mark of --validate"),
    (["--probe", "--validate", "x"], "--probe and --validate: give one of"),
])
def test_dropped_flags_are_refused(capsys, argv, needle):
    code, cap = run_cli(["plan", *argv], capsys)
    assert code == 2 and cap.err.count("\n") == 1 and needle in cap.err, cap.err


@pytest.mark.parametrize("value", ["nan", "inf", "-inf", "-1", "0", "abc"])
def test_tolerance_must_be_a_finite_number_above_zero(capsys, tmp_path, value):
    code, cap = run_cli(["plan", "--validate", str(tmp_path), f"--tolerance={value}"], capsys)
    assert code == 2 and cap.err.count("\n") == 1, cap.err
    assert f"'{value}' is not valid: give a finite number > 0" in cap.err and "--tolerance" in cap.err, cap.err


def test_the_flag_form_keeps_its_defaults_and_the_override_form_its_listing(capsys):
    code, cap = run_cli(["plan", "--params", "1B", "--strategy", "ddp", "--json"], capsys)
    doc = json.loads(cap.out)["inputs"]
    assert code == 0 and (doc["optimizer"], doc["activation_checkpointing"]) == ("adam", "none")
    assert (doc["parallel"]["devices_per_node"], doc["parallel"]["nodes"]) == (1, 1)
    code, cap = run_cli(["plan", "trainer.devices=2", "--strategy", "ddp,fsdp", "--hardware", "h100_sxm"], capsys)
    assert code == 0 and "fsdp" in cap.out, cap.err

"""Planner defects found by a user-path review (2026-12-03): the flag form's --dropout, SGD
without momentum, and fp16 AMP on CPU (which Lightning runs as bf16-mixed)."""
from __future__ import annotations

import json
import subprocess
import sys

from scalelab.plan.run_records import optimizer_of_run

NANO_PARAMS = 135_808          # gpt_nano: 2 layers x 64 wide, vocab 256, seq 64 (tests/unit/test_plan_formulas.py)


def _cli(*args):
    return subprocess.run([sys.executable, "-m", "scalelab.cli", *args], capture_output=True, text=True, timeout=120)


def _plan_json(*args) -> dict:
    proc = _cli("plan", *args, "--json")
    assert proc.returncode == 0, proc.stderr
    return json.loads(proc.stdout)


def test_the_flag_forms_dropout_is_planned_and_run_as_the_override_form():
    flags = _plan_json("--model", "gpt_nano", "--strategy", "ddp", "--devices", "2", "--hardware", "this_cpu",
                       "--dropout", "0.1")
    overrides = _plan_json("strategy=ddp", "model=gpt_nano", "trainer.devices=2", "hardware_profile=this_cpu",
                           "model.arch.dropout=0.1")
    # torch runs dropout > 0 on CPU with the math kernel: s x s scores and masks stored, both forms
    assert flags["inputs"]["model"]["attention"] == overrides["inputs"]["model"]["attention"] == "math"
    assert flags["memory"]["activations_bytes_per_device"] == overrides["memory"]["activations_bytes_per_device"]
    # the printed same job trains the planned model (it dropped the dropout)
    assert "model.arch.dropout=0.1" in flags["train_command"].split()
    no_dropout = _plan_json("--model", "gpt_nano", "--strategy", "ddp", "--devices", "2", "--hardware", "this_cpu")
    assert no_dropout["inputs"]["model"]["attention"] == "flash"
    assert "dropout" not in no_dropout["train_command"]
    # an explicit kernel is kept
    flash = _plan_json("--model", "gpt_nano", "--strategy", "ddp", "--devices", "2", "--hardware", "this_cpu",
                       "--dropout", "0.1", "--attention", "flash")
    assert flash["inputs"]["model"]["attention"] == "flash"


def test_sgd_without_momentum_has_no_optimizer_state():
    doc = _plan_json("strategy=ddp", "model=gpt_nano", "optim=sgd", "optim.optimizer.momentum=0", "trainer.devices=2")
    mem = doc["memory"]
    assert mem["optimizer_bytes_per_device"] == 0                       # torch allocates no momentum buffer
    assert mem["model_states_bytes_per_device"] == 2 * 4 * NANO_PARAMS   # fp32 params + grads: 1,086,464
    with_momentum = _plan_json("strategy=ddp", "model=gpt_nano", "optim=sgd", "trainer.devices=2")
    assert with_momentum["memory"]["optimizer_bytes_per_device"] == 4 * NANO_PARAMS
    run = {"optimizer": "sgd", "config": {"optim": {"optimizer": {"momentum": 0.0}}}}
    assert optimizer_of_run(run) == "sgd_nomomentum"
    assert optimizer_of_run({"optimizer": "sgd", "config": {"optim": {"optimizer": {"momentum": 0.9}}}}) == "sgd"
    assert optimizer_of_run({"optimizer": "adamw"}) == "adamw"
    # the key deleted (~optim.optimizer.momentum): torch's default 0; no config block at all: as recorded
    assert optimizer_of_run({"optimizer": "sgd", "config": {"optim": {"optimizer": {"lr": 0.1}}}}) == "sgd_nomomentum"
    assert optimizer_of_run({"optimizer": "sgd"}) == "sgd"
    # the flag form's same job runs the optimizer planned
    flags = _plan_json("--model", "gpt_nano", "--strategy", "ddp", "--devices", "2", "--hardware", "this_cpu",
                       "--optimizer", "sgd_nomomentum")
    assert flags["memory"]["optimizer_bytes_per_device"] == 0
    assert "optim=sgd" in flags["train_command"] and "optim.optimizer.momentum=0" in flags["train_command"]


def test_the_override_form_on_the_other_kind_of_device_is_planned_for_it():
    """`plan strategy=fsdp ... --hardware h100_sxm` of a CPU job kept the CPU's 16-bit Blocks (only the
    collectives were redone): it must equal the same job with hardware_profile=h100_sxm and the flag form."""
    job = ["strategy=fsdp", "model=gpt_nano", "trainer.precision=bf16-mixed", "trainer.devices=2",
           "data.global_batch_size=16"]
    other = _plan_json(*job, "--hardware", "h100_sxm")["memory"]["activations_bytes_per_device"]
    named = _plan_json(*job, "hardware_profile=h100_sxm")["memory"]["activations_bytes_per_device"]
    flags = _plan_json("--model", "gpt_nano", "--strategy", "fsdp", "--devices", "2", "--global-batch", "16",
                       "--precision", "bf16-mixed", "--hardware", "h100_sxm")["memory"]["activations_bytes_per_device"]
    cpu = _plan_json(*job, "trainer.accelerator=cpu")["memory"]["activations_bytes_per_device"]
    assert other == named == flags and cpu < other


def test_fp16_amp_on_cpu_is_refused_before_any_rank_starts():
    want = "error: trainer.precision=16-mixed on CPU: Lightning runs it as bf16-mixed there"
    # trainer.accelerator=cpu: on a host with a GPU, auto is the GPU (where 16-mixed runs)
    train = subprocess.run([sys.executable, "-m", "scalelab.train", "strategy=ddp", "trainer.precision=16-mixed",
                            "trainer.accelerator=cpu", "hydra.run.dir=/nonexistent/never-made"],
                           capture_output=True, text=True, timeout=120)
    plan = _cli("plan", "strategy=single", "model=gpt_nano", "trainer.precision=16-mixed", "trainer.accelerator=cpu")
    flags = _cli("plan", "--model", "gpt_nano", "--strategy", "ddp", "--precision", "fp16", "--hardware", "this_cpu")
    for proc in (train, plan):
        assert proc.returncode == 2, proc.stderr
        assert proc.stderr.strip().splitlines()[-1].startswith(want), proc.stderr
        assert "Traceback" not in proc.stderr
    # the flag form names the flag typed (the trainer's key named nothing the user gave)
    assert flags.returncode == 2 and flags.stderr == (
        "error: --precision fp16 on CPU: Lightning runs it as bf16-mixed there (its fp16 AMP is GPU-only); "
        "give --precision bf16-mixed or 32\n"), flags.stderr
    shape = _cli("plan", "--layers", "4", "--hidden", "64", "--strategy", "ddp")
    assert shape.returncode == 2 and shape.stderr.startswith("error: --layers --hidden without --heads: "), shape.stderr
    # on a GPU profile it stays a plan (DDP fp16 with a loss scaler)
    assert _plan_json("--model", "gpt_nano", "--strategy", "ddp", "--precision", "fp16")["inputs"]["precision"] \
        == "fp16-mixed"


def test_strategy_lists_batch_splits_and_call_counts_as_a_user_reads_them():
    from scalelab.plan.cli import _strategies
    from scalelab.plan.report import _calls
    from scalelab.plan.strategies import STRATEGIES

    assert _strategies("ddp,ddp") == ["ddp"]                            # printed two identical rows
    assert _strategies("all,ddp") == list(STRATEGIES)                   # was: unknown strategy 'all'
    assert _strategies("zero3, all") == ["zero3", *(s for s in STRATEGIES if s != "zero3")]
    # 15 sequences over 2 ranks: no micro-batch was given, so none is named ("2 x 1 = 2" before)
    proc = _cli("plan", "--model", "gpt_nano", "--strategy", "ddp", "--global-batch", "15", "--devices", "2")
    assert proc.returncode == 2
    assert proc.stderr == "error: --global-batch 15 does not split over 2 data-parallel ranks; valid: multiples of 2\n"
    assert (_calls(1079), _calls(1.0), _calls(2.82653)) == ("1079", "1", "2.83")



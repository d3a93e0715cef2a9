"""Tensor parallelism the trainer refuses is no plan: `plan --params 7B --strategy tp --devices 8`
planned tp 8 on GPT-2's vocabulary 50257 (odd: 29 x 1733) and printed a same job that scalelab-train
refuses ("strategy.tensor_parallel_size=8 does not divide vocab_size 50257"); `--strategy all` listed
tp and fsdp_tp with figures; recommend pruned them as "the model's shape" without naming the vocab."""
import json
import shlex

import pytest

from scalelab.plan.hardware import load_hardware
from scalelab.plan.spec import ModelSpec, PlanError
from scalelab.recommend.space import Request, enumerate_candidates
from ..conftest import run_cli as _run

BASE = ["plan", "--params", "7B", "--devices", "8", "--global-batch", "64", "--hardware", "h100_sxm"]


@pytest.mark.parametrize("strategy, tp", [("tp", 8), ("fsdp_tp", 2)])
def test_tp_that_does_not_divide_the_vocab_is_refused_as_the_trainer_does(capsys, strategy, tp):
    code, out = _run([*BASE, "--strategy", strategy], capsys)
    assert code == 2 and out.out == "" and out.err.count("\n") == 1
    # the trainer's reason (check_tp_degree: "... does not divide vocab_size 50257: choose one of 1"),
    # and a vocabulary that splits: 50257 up to a multiple of 128 = 393 x 128 = 50304
    assert out.err.startswith(f"error: strategy={strategy}: tp {tp} does not divide vocab_size 50257")
    # valid: 1 alone; 2, 4, 8 once the vocabulary is padded (32 heads, 4096 wide split 8 ways)
    assert ("valid tp: 1 (no tensor parallelism), or 2, 4, 8 with a vocabulary they divide (padded: --vocab / "
            "model.arch.vocab_size 50304)") in out.err


def test_the_trainer_refuses_the_old_same_job_and_runs_the_padded_one(capsys):
    """plan == run: the command plan printed before (vocab 50257, tp 8) fails the trainer's own
    validation; with --vocab 50304 the plan's same job passes it."""
    from scalelab.plan_job import terms_for_job
    old = ("strategy=tp model=gpt_nano model.arch.n_layers=33 model.arch.d_model=4096 model.arch.n_heads=32 "
           "model.arch.vocab_size=50257 model.arch.seq_len=2048 model.arch.mlp_ratio=4 trainer.devices=8 "
           "data.global_batch_size=64 trainer.precision=bf16-mixed optim=adamw hardware_profile=h100_sxm "
           "strategy.tensor_parallel_size=8").split()
    with pytest.raises(PlanError, match="tensor_parallel_size=8 does not divide vocab_size 50257"):
        terms_for_job(old)
    code, out = _run([*BASE, "--strategy", "tp", "--vocab", "50304", "--global-batch", "8", "--json"], capsys)
    doc = json.loads(out.out)
    assert code == 0 and doc["inputs"]["parallel"]["tp"] == 8 and doc["inputs"]["model"]["vocab"] == 50304
    overrides = shlex.split(doc["train_command"])[1:]
    assert "model.arch.vocab_size=50304" in overrides
    terms, _ = terms_for_job(overrides)
    assert (terms.layout.tp, terms.model.vocab) == (8, 50304)


def test_strategy_all_marks_tp_rows_refused_not_fits(capsys):
    code, out = _run([*BASE, "--strategy", "all", "--json"], capsys)
    assert code == 0
    docs = {d["inputs"]["strategy"]: d for d in json.loads(out.out)}
    for name in ("tp", "fsdp_tp"):
        assert docs[name]["memory"] is None and docs[name]["time"] is None
        assert "does not divide vocab_size 50257" in docs[name]["refused"]
        assert "refuses it" not in docs[name]["refused"]     # the text's header says so once
    assert docs["zero3_offload"]["memory"]["fits"]           # the others are still planned
    code, out = _run([*BASE, "--strategy", "all"], capsys)
    rows = {line.split()[0]: line.split() for line in out.out.splitlines() if line.split()}
    assert rows["tp"][7] == "refused" and rows["fsdp_tp"][7] == "refused" and "yes" in rows["nd"]
    assert out.out.count("scalelab-train refuses it") == 1    # the header, not again in each reason
    assert "cannot run this job (scalelab-train refuses it):" in out.out


def test_recommend_names_the_dimension_that_does_not_divide():
    model = ModelSpec.trainer_gpt_for_params(7e9)          # 33 x 4096, 32 heads, vocab 50257
    req = Request(model, None, load_hardware("h100_sxm"), "h100_sxm", 8, nodes=4, global_batches=(64,),
                  precisions=("bf16-mixed",), strategies=("tp", "fsdp_tp"), checkpointing=("full",))
    _, pruned = enumerate_candidates(req)
    why = [k for k in pruned if k.startswith("tp: ")]
    assert len(why) == 1 and "vocab_size 50257 is not divisible by tp 2, 4, 8" in why[0]
    assert "50304" in why[0] and "model n_heads" not in why[0]   # 32 heads split 2, 4, 8 ways

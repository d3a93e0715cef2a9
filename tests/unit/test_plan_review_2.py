"""Planner review findings, by hand: PowerSGD's factors for the model scalelab-train builds (four
attention Linears, an untied head); its blocks have no biases (FSDP's root); an MLP is one FSDP2
unit; a precision the trainer refuses for a strategy is refused by the flag form too (checked
against the trainer's own validation for every strategy); an empty strategy list is one line; the
tp hint lists every degree a padded vocabulary serves."""
import subprocess
import sys

import pytest

from scalelab.plan.comm import collectives, powersgd_elements
from scalelab.plan.spec import ModelSpec, PlanError, get_strategy
from scalelab.plan.splits import check_tp_splits
from scalelab.plan.strategies import STRATEGIES, trainer_refuses

# scalelab-train's GPT, 12 x 768, 12 heads, context 1024, GPT-2's vocabulary
GPT = ModelSpec.trainer_gpt(12, 768, 12, 50257, 1024)


def test_powersgd_factors_of_the_trainers_model():
    """Rank 1: each n x m weight sends n + m values (torch compresses it when 2(n + m) < nm); vectors
    go whole. LayerNorms 2 x 2 x 768 x 12 + 2 x 768 = 38,400; a block's q, k, v, out 4 x (768 + 768)
    = 6,144, up and down 2 x (3,072 + 768) = 7,680: x 12 = 165,888; token embedding and head 2 x
    (50,257 + 768) = 102,050; positions 1,024 + 768 = 1,792. 308,130 in all (was 38,836,049)."""
    assert GPT.n_params == 12 * 7_080_960 + 2 * 50_257 * 768 + 1_024 * 768 + 2 * 768 == 162_954_240
    assert powersgd_elements(GPT, 1) == 38_400 + 165_888 + 102_050 + 1_792


def test_the_trainers_blocks_have_no_biases():
    """FSDP's root unit is what the blocks leave: token and position embeddings, the final
    LayerNorm and the untied head, 2 x 50,257 x 768 + 1,024 x 768 + 2 x 768 = 77,982,720."""
    assert GPT.layer_params == 4 * 768 * 768 + 2 * 768 * 3072 + 4 * 768            # 7,080,960
    assert GPT.n_params - GPT.n_layers * GPT.layer_params == 77_982_720
    # the Megatron-style shape (biases, tied head) keeps its count
    mega = ModelSpec.from_shape(12, 768, 12, 50257, 1024)
    assert mega.layer_params == 4 * 768 * 768 + 2 * 768 * 3072 + 9 * 768 + 3072


def _layout(strategy, model, devices):
    from scalelab.plan.step_time import build_terms

    return build_terms(model, strategy, devices=devices, global_batch=devices, precision="32").layout


def test_an_mlp_is_one_fsdp_unit():
    mlp = ModelSpec(4 * (64 * 64 + 64), 4, 64, 1, 10, 1, kind="mlp")
    colls = {c.name: c for c in collectives(mlp, get_strategy("fsdp"), _layout("fsdp", mlp, 2), "32")}
    # the buffer is the whole model (4 x 4,160 parameters, fp32): one call each, not L + 1 = 5
    for name in ("param_all_gather_fwd", "grad_reduce_scatter"):
        assert (colls[name].calls, colls[name].bytes_per_call) == (1, 4 * 4_160 * 4), name


def _trainer_verdict(name: str, precision: str, target: str) -> str | None:
    from scalelab.plan_job import check_job

    devices = {"nd": ["trainer.devices=4", "strategy.tp=2", "strategy.pp=2"]}.get(name, ["trainer.devices=2"])
    try:
        check_job([f"strategy={name}", "model=gpt_nano", *devices, f"trainer.precision={precision}"], target)
    except PlanError as exc:
        return str(exc)
    return None


@pytest.mark.parametrize("name", sorted(STRATEGIES))
def test_the_flag_forms_precision_refusals_are_the_trainers(name):
    for target in ("cpu", "gpu"):
        assert _trainer_verdict(name, "32", target) is None          # a layout the trainer takes
        trainer = _trainer_verdict(name, "16-mixed", target)
        assert bool(trainer) == bool(trainer_refuses(get_strategy(name), "fp16-mixed", target)), (target, trainer)
        assert trainer is None or "16-mixed" in trainer
        assert trainer_refuses(get_strategy(name), "bf16-mixed", target) is None
        # bf16-true: every strategy but DeepSpeed's (which keeps its own fp32 master copy)
        trainer = _trainer_verdict(name, "bf16-true", target)
        assert bool(trainer) == bool(trainer_refuses(get_strategy(name), "bf16-true", target)), (target, trainer)
        assert bool(trainer) == name.startswith("zero") and (trainer is None or "bf16-true" in trainer), trainer


def _cli(*args):
    return subprocess.run([sys.executable, "-m", "scalelab.cli", *args], capture_output=True, text=True, timeout=120)


def test_fp16_fsdp_and_empty_strategy_lists_are_one_line():
    shape = ["--layers", "2", "--hidden", "64", "--heads", "4", "--vocab", "256", "--seq-len", "64", "--devices", "2"]
    for args, want in (([*shape, "--strategy", "fsdp", "--precision", "fp16-mixed"],
                        "error: --precision fp16-mixed is not supported by strategy=fsdp"),   # the flag typed
                       ([*shape, "--strategy", ","], "error: --strategy ',' names no strategy; valid: single, ddp,")):
        proc = _cli("plan", *args)
        assert proc.returncode == 2 and proc.stderr.startswith(want) and proc.stderr.count("\n") == 1, proc.stderr
        assert "the same job" not in proc.stdout
    proc = _cli("recommend", "--model", "gpt_nano", "--devices", "2", "--strategies", ",")
    assert proc.returncode == 2 and proc.stderr.startswith("error: --strategies ',' names no strategy"), proc.stderr


def test_the_tp_hint_names_every_degree_a_padded_vocabulary_serves():
    with pytest.raises(PlanError) as e:
        check_tp_splits(GPT, 3, 8, "fsdp_tp")        # 3 of 8 devices: padded for 3 it said "valid tp: 1"
    assert str(e.value).endswith("valid tp: 1 (no tensor parallelism), or 2, 4 with a vocabulary they divide "
                                 "(padded: --vocab / model.arch.vocab_size 50304)")   # 8 does not divide 12 heads
    with pytest.raises(PlanError) as e:              # 12 devices: 50304 = 131 x 384 = lcm(128, 2, 3, 4, 6, 12) x 131
        check_tp_splits(GPT, 5, 12, "fsdp_tp")
    assert str(e.value).endswith("or 2, 3, 4, 6, 12 with a vocabulary they divide (padded: --vocab / "
                                 "model.arch.vocab_size 50304)")

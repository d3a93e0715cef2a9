"""A plan is the same whichever way its hardware is named (--hardware NAME or hardware_profile=NAME):
the TP collectives' bytes depend on the hardware's kind (CPU autocast keeps LayerNorm in bf16, CUDA's
in fp32), and were recomputed for --hardware of a CPU kind only (fsdp_tp, gpt_small, 4 devices, bf16:
20.5 MB vs 29.4 MB of communication per step). And --params below the smallest GPT guessed for it is
one line, exit 2 (--params 1e5 planned a 13.3M-parameter model)."""
import json

import pytest

from scalelab.cli import main
from scalelab.plan.spec import ModelSpec, PlanError

JOB = ["plan", "strategy=fsdp_tp", "trainer.precision=bf16-mixed", "trainer.devices=4", "model=gpt_small",
       "data.global_batch_size=16"]


def _doc(argv, capsys):
    with pytest.raises(SystemExit) as done:
        main(argv)
    assert done.value.code == 0
    return json.loads(capsys.readouterr().out)


def test_the_hardware_s_name_by_flag_or_override_plans_the_same(capsys):
    by_flag = _doc([*JOB, "--hardware", "h100_sxm", "--json"], capsys)
    by_key = _doc([*JOB, "hardware_profile=h100_sxm", "--json"], capsys)
    assert by_flag["comm"] == by_key["comm"]
    assert by_flag["time"]["step_s"] == by_key["time"]["step_s"]


def test_params_below_the_smallest_guessed_gpt_is_refused():
    with pytest.raises(PlanError, match=r"^--params 100,000: the smallest GPT guessed for it has 13,325,312 "):
        ModelSpec.trainer_gpt_for_params(1e5)
    # 1 x 128 at vocab 256, seq 64: 2 x 256 x 128 + 64 x 128 + 128 x 2 (final LN) = 73,984 for the ends,
    # 12 x 128^2 + 4 x 128 (LNs) = 197,120 for the layer
    with pytest.raises(PlanError, match=r"has 271,104 parameters .* embedding and head 73,984\); give the shape"):
        ModelSpec.trainer_gpt_for_params(1e5, seq_len=64, vocab=256)
    assert ModelSpec.trainer_gpt_for_params(7e9).n_params == 7_064_420_352


def test_a_small_params_count_is_guessed_with_its_embeddings_in_mind():
    """--params 125M was guessed 2 layers x 1024 (the width chosen as if all 125M were blocks, then
    the embedding and untied head took 105M of them). By hand, at GPT-2's vocabulary and seq 2048:
    the width solves 12 h^3 / 128 + (2 x 50,257 + 2,048) h = 125M: h = 768 gives 42.5M + 78.8M =
    121.3M, h = 1024 gives 100.7M + 105.0M = 205.7M, so h ~ 790, 768 on the 256 grid. Ends: 2 x
    50,257 x 768 + 2,048 x 768 + 2 x 768 = 78,769,152; a layer 12 x 768^2 + 4 x 768 = 7,080,960;
    (125M - ends) / layer = 6.5 -> 7 layers (49,566,720): 128,335,872 in all."""
    m = ModelSpec.trainer_gpt_for_params(125e6)
    assert (m.n_layers, m.hidden, m.heads, m.n_params) == (7, 768, 6, 128_335_872)
    # the tied-head form (the Megatron-style count): 12 h^3 / 128 + 52,305 h = 125M at h ~ 930 -> 1024;
    # (125M - 52,305 x 1024) / (12 x 1024^2) = 5.7 -> 6 layers
    tied = ModelSpec.from_params(125e6)
    assert (tied.n_layers, tied.hidden) == (6, 1024)

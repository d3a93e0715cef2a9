"""DeepSpeed 0.19.8's model states where they depart from the ZeRO paper, against bytes measured
in real 2-rank fp32 CPU runs (StepMetrics; ZeRO.state_bytes counts DeepSpeed's own buffers).

The measured figures below are from `scalelab-train -m experiment=plan_validation` (gpt_mini:
3 x 128, Psi = 669,440; gpt_wide: 2 x 192, Psi = 1,009,536; global batch 16, no accumulation,
default stage3_param_persistence_threshold 1e5); the same model states were recorded by every
seed. Derived by hand (fp32, N = 2):
- zero1: 4 Psi params + 2 Psi grads (ZeRO-1 keeps only the partition without accumulation)
  + 6 Psi optimizer (fp32 master + Adam m, v: 12 Psi / 2) = 12 Psi.
- zero3 gpt_mini: every tensor is below 1e5 elements, so all stay whole on every rank besides
  their partition: params 2 Psi + 4 Psi; grads 2 Psi; optimizer 6 Psi = 14 Psi.
- zero3 gpt_wide: the MLP matrices (192 x 768 = 147,456) are partitioned; q, k, v, out (192^2),
  token / position embeddings, the untied head and LayerNorms (419,712 elements) persist.
- zero3_offload: + the host's fp32 gradient partition buffer and the fp32 copy the CPU Adam
  steps on: 2 Psi each.
"""
import pytest

from scalelab.plan import ModelSpec, get_strategy, model_states, resolve_layout

MINI = ModelSpec(669_440, 3, 128, 4, 256, 96)
WIDE = ModelSpec(1_009_536, 2, 192, 4, 256, 128)

MEASURED = {   # (params, grads, optimizer) bytes per rank, run.json model_state_breakdown_per_rank
    ("zero1", "mini"): (2_677_760, 1_338_880, 4_016_640),
    ("zero2", "mini"): (2_677_760, 1_338_880, 4_016_640),
    ("zero3", "mini"): (4_016_640, 1_338_880, 4_016_640),
    ("zero3", "wide"): (3_697_920, 2_019_072, 6_057_216),
    ("zero3_offload", "mini"): (4_016_640, 2_677_760, 4_016_640),
    ("zero3_offload", "wide"): (3_697_920, 4_038_144, 6_057_216),
    ("zero2_offload", "wide"): (4_038_144, 2_019_072, 6_057_216),
}


def test_persistent_tensors_by_hand():
    h = 192
    assert WIDE.small_params(100_000) == 8 * h * h + 256 * h + 128 * h + 256 * h + (2 * 4 + 2) * h
    assert MINI.small_params(100_000) == MINI.n_params          # every tensor of gpt_mini
    assert WIDE.small_params(0) == 0
    big = ModelSpec(7_000_000_000, 32, 4096, 32, 32000, 4096)  # Llama-7B-like: vectors only
    assert big.small_params(100_000) < 1e-3 * big.n_params


@pytest.mark.parametrize("strategy,model", sorted(MEASURED))
def test_deepspeed_states_match_the_measured_runs(strategy, model):
    spec = MINI if model == "mini" else WIDE
    st = get_strategy(strategy)
    layout = resolve_layout(st, spec, 2, micro_batch=8, global_batch=16)
    ms = model_states(spec, st, layout, "32", "adam")
    assert ms.total_bytes + ms.offloaded_bytes == sum(MEASURED[strategy, model])


def test_zero1_keeps_full_gradients_with_accumulation():
    st = get_strategy("zero1")
    one = model_states(MINI, st, resolve_layout(st, MINI, 2, micro_batch=8, global_batch=16), "32", "adam")
    acc = model_states(MINI, st, resolve_layout(st, MINI, 2, micro_batch=4, global_batch=16), "32", "adam")
    assert (one.grads_bytes, acc.grads_bytes) == (2 * MINI.n_params, 4 * MINI.n_params)


def test_persistence_threshold_comes_from_the_strategy_config():
    assert get_strategy("zero3").param_persistence_elements == 100_000
    assert get_strategy("zero3", {"stage3_param_persistence_threshold": 0}).param_persistence_elements == 0
    st = get_strategy("zero3", {"stage3_param_persistence_threshold": 0})
    ms = model_states(MINI, st, resolve_layout(st, MINI, 2, micro_batch=8, global_batch=16), "32", "adam")
    assert ms.params_bytes == 2 * MINI.n_params                   # the partition only

"""DeepSpeed ZeRO-3 keeps gathered parameters from the forward to the backward (plan/zero3_trace.py):
the planner's count against real DeepSpeed 0.19.8 engines (tests/integration/zero3_reuse_probe.py,
2 gloo ranks).

Expected elements by hand for the probe's GPT (4 layers, width 32, MLP 128, vocabulary 64,
context 16; every tensor partitioned): a Block 12,416 (q, k, v, out 1,024 each, up and down 4,096
each, two LayerNorms 64 each), tok_emb 2,048, pos_emb 512, ln_f 64, lm_head 2,048; 54,336 in all.
- DeepSpeed's defaults (reuse distance 1e9, prefetch 5e7): all 54,336, either fetch unit; and none
  with reuse distance 0 and no prefetch.
- Fetch unit module, no prefetch: a tensor stays when fewer than R elements of tensors are used
  between its forward and its backward. Layer 3's MLP (up, down: the MLP's backward comes first)
  + ln_f + lm_head = 8,192 + 64 + 2,048 = 10,304 at R = 20,000; at R = 40,000 also layer 3's
  LayerNorms and attention and layer 2's MLP: 10,304 + 4,224 + 8,192 = 22,720.
- Fetch unit block (a leaf module): DeepSpeed counts the later modules' whole subtrees when it
  releases a leaf, so a Block stays when the blocks after it, ln_f and lm_head hold fewer than R
  elements before the backward's root entry (which holds them all): at R = 20,000 layers 2 and 3
  (12,416 + 2,112 < 20,000 for layer 2) and, since the embeddings count only their own tensors
  (5,248 between forward and backward), tok_emb and pos_emb: 2 x 12,416 + 2,112 + 2,560 = 29,504.
"""
from pathlib import Path

import pytest

from scalelab.plan import ModelSpec, get_strategy, model_states, resolve_layout
from scalelab.plan.zero3_trace import gpt_units, kept_gathered_elements

from ..conftest import torchrun_probe

SPEC = ModelSpec(54_336, 4, 32, 2, 64, 16)
HAND = {"block_r1000000000_p50000000": 54_336, "module_r1000000000_p50000000": 54_336,
        "module_r0_p0": 0, "module_r20000_p0": 10_304, "module_r40000_p0": 22_720, "block_r20000_p0": 29_504}
DEFAULT = ("block_r1000000000_p50000000", "module_r20000_p0", "block_r20000_p0", "module_r40000_p0")


def _case(name):
    unit, r, p, *live = name.split("_")
    return unit, int(r[1:]), int(p[1:]), int(live[0][1:]) if live else 10**9


def _planner(name):
    unit, reuse, prefetch, live = _case(name)
    return kept_gathered_elements(gpt_units(SPEC, unit), 0, reuse, prefetch, live)


def test_hand_counts_are_the_planners():
    for name, expected in HAND.items():
        assert _planner(name) == expected, name
    assert sum(n for e, c in SPEC.weight_matrices() for n in [e * c]) + 4 * 128 + 64 == 54_336


def _check(probe, names):
    for name in names:
        got = [probe[r][name] for r in (0, 1)]
        assert got[0] == got[1], name                         # both ranks hold the same
        assert got[0]["params"] == 54_336
        # fp32 whole tensors; one still in flight has its storage set when its all-gather is
        # waited for, or at once when DeepSpeed gathered it alone (one tensor: _all_gather_sequential)
        held = got[0]["elements"] * 4
        assert held - got[0]["inflight_elements"] * 4 <= got[0]["storage_bytes"] <= held, name
        if name in HAND:
            assert got[0]["elements"] == HAND[name], name
        assert _planner(name) == got[0]["elements"], name


def test_planner_keeps_what_deepspeed_keeps(tmp_path):
    probe = torchrun_probe(Path(__file__).with_name("zero3_reuse_probe.py"), 2, tmp_path, ",".join(DEFAULT))
    _check(probe, DEFAULT)


@pytest.mark.slow
def test_planner_keeps_what_deepspeed_keeps_every_case(tmp_path):
    probe = torchrun_probe(Path(__file__).with_name("zero3_reuse_probe.py"), 2, tmp_path, "all")
    _check(probe, list(probe[0]))


def test_the_memory_figure_and_the_backward_gather_follow():
    """At 2+ ranks the kept tensors are device memory at the activations' peak and are not
    gathered again in the backward; at world size 1 ZeRO-3 gathers nothing."""
    from scalelab.plan.comm import collectives
    st = get_strategy("zero3", {"stage3_param_persistence_threshold": 0})
    short = get_strategy("zero3", {"stage3_param_persistence_threshold": 0, "stage3_max_reuse_distance": 0,
                                   "stage3_prefetch_bucket_size": 0})
    lay = resolve_layout(st, SPEC, 2, micro_batch=2, global_batch=4)
    a, b = model_states(SPEC, st, lay, "32", "sgd"), model_states(SPEC, short, lay, "32", "sgd")
    largest = SPEC.largest_layer_params
    assert a.buffers_bytes - b.buffers_bytes == pytest.approx((54_336 - 2 * largest) * 4)
    names = {c.name: c for c in collectives(SPEC, st, lay, "32")}
    assert "param_all_gather_bwd" not in names
    assert "param_all_gather_bwd" in {c.name for c in collectives(SPEC, short, lay, "32")}


def test_offloaded_partitions_are_copied_to_the_device_by_the_same_rules():
    """zero3_offload keeps its partitions in host memory and copies them to the device on fetch,
    also at world size 1; what it keeps there is not copied again for the backward."""
    from scalelab.plan.comm import collectives
    from scalelab.plan.model_states import zero3_kept_gathered
    opts = {"stage3_param_persistence_threshold": 0}
    st = get_strategy("zero3_offload", opts)
    short = get_strategy("zero3_offload", {**opts, "stage3_max_reuse_distance": 0, "stage3_prefetch_bucket_size": 0})
    one = resolve_layout(st, SPEC, 1, micro_batch=2, global_batch=4)       # 2 micro-batches
    assert zero3_kept_gathered(SPEC, st, one) == 54_336
    assert zero3_kept_gathered(SPEC, get_strategy("zero3", opts), one) == 0   # on the device: nothing gathered
    largest = SPEC.largest_layer_params
    assert model_states(SPEC, st, one, "32", "sgd").buffers_bytes >= 54_336 * 4 + largest * 4

    def fetches(strategy):
        (c,) = [c for c in collectives(SPEC, strategy, one, "32") if c.name == "param_from_host"]
        return c.calls
    # after the step 1, then per micro-batch: the forward, and the backward for what was released
    assert fetches(st) == 1 + 2 * 1
    assert fetches(short) == 1 + 2 * 2

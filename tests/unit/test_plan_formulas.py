"""The planner's formulas against numbers derived by hand from the papers they cite."""
import math
from dataclasses import replace

import pytest

from scalelab.plan import (ModelSpec, activation_bytes_per_device, collectives, get_strategy,
                           layer_activation_bytes, megatron_flops, model_flops, hardware_flops,
                           model_states, resolve_layout, zero_paper_bytes)
from scalelab.plan.comm import Collective
from scalelab.plan.flops import layer_forward_flops

NANO = ModelSpec.from_shape(2, 64, 4, 256, 64)       # 2 layers, h 64, 4 heads, V 256, s 64


def layout(strategy, model, devices, **kw):
    return resolve_layout(get_strategy(strategy), model, devices, **kw)


# ---------------------------------------------------------------- ZeRO model states
def test_zero_paper_figure_1():
    # Rajbhandari et al. 2020, Fig. 1: Psi = 7.5B, N_d = 64, K = 12 -> 120 / 31.4 / 16.6 / 1.9 GB.
    psi = 7.5e9
    assert zero_paper_bytes(psi, 64, 0) == pytest.approx(120e9)
    assert zero_paper_bytes(psi, 64, 1) / 1e9 == pytest.approx(31.4, abs=0.05)
    assert zero_paper_bytes(psi, 64, 2) / 1e9 == pytest.approx(16.6, abs=0.05)
    assert zero_paper_bytes(psi, 64, 3) / 1e9 == pytest.approx(1.9, abs=0.05)


@pytest.mark.parametrize("strategy,stage", [("zero1", 1), ("zero2", 2), ("zero3", 3)])
def test_deepspeed_strategies_follow_the_paper(strategy, stage):
    # With gradient accumulation (2 micro-batches): DeepSpeed's ZeRO-1 then keeps full gradients,
    # as the paper has it. ZeRO-3 adds the LayerNorms and biases it keeps whole (persistence
    # threshold): 0.03 % of Psi, 0.2 % of the per-rank bytes at 64 ranks.
    m = ModelSpec.from_params(7.5e9)
    L = layout(strategy, m, 64, micro_batch=1, global_batch=128)
    st = model_states(m, get_strategy(strategy), L, "bf16-mixed", "adam")
    assert st.total_bytes == pytest.approx(zero_paper_bytes(7.5e9, 64, stage), rel=3e-3 if stage == 3 else 1e-9)


def test_deepspeed_zero1_without_accumulation_keeps_the_gradient_partition_only():
    # DeepSpeed 0.19.8 reduces ZeRO-1 gradients bucket-wise in backward hooks (overlap_comm,
    # contiguous_gradients) and keeps only its partition at an accumulation boundary: measured in
    # tests/integration/test_deepspeed.py. Then ZeRO-1 holds what ZeRO-2 holds.
    m = ModelSpec.from_params(7.5e9)
    one = model_states(m, get_strategy("zero1"), layout("zero1", m, 64), "bf16-mixed", "adam")
    two = model_states(m, get_strategy("zero2"), layout("zero2", m, 64), "bf16-mixed", "adam")
    assert one.total_bytes == pytest.approx(two.total_bytes) == pytest.approx(zero_paper_bytes(7.5e9, 64, 2))


def test_torch_family_keeps_fp32_states_whatever_the_precision():
    # Autocast keeps fp32 weights and grads: 4 + 4 + 8 (Adam) = 16 B/param; SGD momentum: 12.
    m = ModelSpec(1_000_000, 2, 64, 4, 256, 64)
    for prec in ("32", "bf16-mixed"):
        st = model_states(m, get_strategy("ddp"), layout("ddp", m, 4), prec, "adam")
        assert (st.params_bytes, st.grads_bytes, st.optimizer_bytes) == (4e6, 4e6, 8e6)
    st = model_states(m, get_strategy("ddp"), layout("ddp", m, 4), "32", "sgd")
    assert st.total_bytes == 12e6


def test_fsdp_shards_everything_and_deepspeed_fp32_keeps_a_master_copy():
    m = ModelSpec(1_000_000, 2, 64, 4, 256, 64)
    st = model_states(m, get_strategy("fsdp"), layout("fsdp", m, 4), "32", "adam")
    assert st.total_bytes == pytest.approx(16e6 / 4)
    # DeepSpeed ZeRO-2 in fp32: params 4 (full) + (grads 4 + fp32 clone 4 + m, v 8) / N.
    st = model_states(m, get_strategy("zero2"), layout("zero2", m, 4), "32", "adam")
    assert st.total_bytes == pytest.approx(4e6 + 16e6 / 4)
    # ZeRO-3 in fp32: DeepSpeed 0.19.8 still keeps an fp32 master copy (measured): (4 + 4 + 4 + 8) / N.
    # (persistence threshold 0: with the default 1e5 every tensor of this small model stays whole)
    z3 = get_strategy("zero3", {"stage3_param_persistence_threshold": 0})
    st = model_states(m, z3, layout("zero3", m, 4), "32", "adam")
    assert st.total_bytes == pytest.approx(20e6 / 4)
    st = model_states(m, get_strategy("zero3"), layout("zero3", m, 4), "32", "adam")
    assert st.total_bytes == pytest.approx(20e6 / 4 + 4 * m.small_params(100_000))   # + small tensors whole


def test_offload_moves_optimizer_and_grads_to_host():
    m = ModelSpec(1_000_000, 2, 64, 4, 256, 64)
    st = model_states(m, get_strategy("zero2_offload"), layout("zero2_offload", m, 4), "bf16-mixed", "adam")
    assert st.total_bytes == 2e6                          # 16-bit params only (DeepSpeed: 2 Psi)
    assert st.offloaded_bytes == pytest.approx((12e6 + 4e6) / 4)


def test_tensor_and_pipeline_split_the_model():
    m = ModelSpec.from_shape(8, 256, 8, 256, 128)
    st = model_states(m, get_strategy("tp"), layout("tp", m, 4), "32", "adam")
    # TP splits the matrices and the vocabulary 4 ways; the LayerNorms (2 x 2 x 256 a block,
    # 2 x 256 at the end) and the position embedding (128 x 256) stay whole on every rank
    replicated = 8 * 4 * 256 + 2 * 256 + 128 * 256
    assert st.total_bytes == pytest.approx(16 * ((m.n_params - replicated) / 4 + replicated))
    st = model_states(m, get_strategy("pipeline"), layout("pipeline", m, 4), "32", "adam")
    # 8 / 4 = 2 layers a stage; the largest is stage 0 with the token (256 x 256) and position
    # (128 x 256) embeddings; the last holds 2 layers, the head (a copy of the tied embedding,
    # 256 x 256) and the final LayerNorm (2 x 256): smaller. n_params here is the tied model's.
    assert m.n_params == 8 * m.layer_params + 256 * 256 + 128 * 256 + 2 * 256
    assert st.total_bytes == pytest.approx(16 * (2 * m.layer_params + 256 * 256 + 128 * 256))
    untied = ModelSpec.from_shape(8, 256, 8, 256, 128, n_params=m.n_params + 256 * 256)
    st = model_states(untied, get_strategy("pipeline"), layout("pipeline", untied, 4), "32", "adam")
    assert st.total_bytes == pytest.approx(16 * (2 * m.layer_params + 256 * 256 + 128 * 256))   # the same stage 0


# ---------------------------------------------------------------- FLOPs (Narayanan et al. 2021)
def test_megatron_flops_hand_derived():
    # B=8, s=64, l=2, h=64, V=256: layer fwd 24Bsh^2 + 4Bs^2h = 58,720,256; head fwd 2BshV
    # = 16,777,216; x3 -> 402,653,184. With full recompute one more forward of the layers.
    assert layer_forward_flops(NANO, 8 * 64) == 58_720_256
    assert model_flops(NANO, 8) == 402_653_184
    assert megatron_flops(8, 64, 2, 64, 256) == pytest.approx(402_653_184)
    assert hardware_flops(NANO, 8, "full") == 402_653_184 + 2 * 58_720_256
    assert megatron_flops(8, 64, 2, 64, 256, recompute=True) == pytest.approx(520_093_696)
    assert hardware_flops(NANO, 8, "selective") == 402_653_184 + 2 * 4 * 8 * 64 * 64 * 64


def test_flops_approach_6N_per_token_for_wide_models():
    m = ModelSpec.from_shape(48, 8192, 64, 32000, 256)
    per_token = model_flops(m, 1) / m.seq_len
    assert per_token / (6 * m.n_params) == pytest.approx(1.0, abs=0.02)


# ---------------------------------------------------------------- activations (Korthikanti et al. 2022)
@pytest.mark.parametrize("t", [1, 2, 8])
def test_korthikanti_table_2(t):
    s, b, h, a = 2048, 1, 12288, 96
    sbh, r = s * b * h, a * s / h
    f = lambda **kw: layer_activation_bytes(s, b, h, a, t, **kw)
    assert f() == pytest.approx(sbh * (10 + 24 / t + 5 * r / t))
    assert f(sequence_parallel=True) == pytest.approx(sbh * (34 / t + 5 * r / t))
    assert f(checkpointing="selective") == pytest.approx(sbh * (10 + 24 / t))
    assert f(sequence_parallel=True, checkpointing="selective") == pytest.approx(sbh * 34 / t)
    assert f(checkpointing="full") == pytest.approx(2 * sbh)
    assert f(sequence_parallel=True, checkpointing="full") == pytest.approx(2 * sbh / t)


def test_fp32_activations_double_the_16_bit_tensors_not_the_masks():
    s, b, h, a = 64, 8, 64, 4
    # 16 two-byte tensors -> 4 bytes, 2 one-byte masks: 66 s b h; scores 2 x 4 + 1 = 9 a s^2 b.
    assert layer_activation_bytes(s, b, h, a, e=4) == s * b * h * 66 + 9 * a * s * s * b


def test_activations_per_device_adds_embedding_and_logits():
    # The paper's setting: math attention (s x s scores stored) with dropout.
    paper = replace(NANO, attention="math", dropout=0.1)
    L = layout("ddp", paper, 2, micro_batch=8)
    s, b, h, V = 64, 8, 64, 256
    per_layer = s * b * h * 34 + 5 * 4 * s * s * b
    expected = 2 * per_layer + s * b * h + 4 * s * b * h + 4 * s * b * V
    assert activation_bytes_per_device(paper, L, "bf16-mixed") == expected


def test_flash_attention_without_dropout_drops_the_scores_and_masks():
    # scalelab's GPT under autocast (activations.py, formula 2): s b (40 h + 16 + 4 a) per layer;
    # embedding ids 8 s b; final LayerNorm in/stats/out, fp32 log-softmax, int64 targets.
    L = layout("ddp", NANO, 2, micro_batch=8)
    s, b, h, a, V = 64, 8, 64, 4, 256
    per_layer = s * b * (40 * h + 16 + 4 * a)
    expected = 2 * per_layer + 8 * s * b + s * b * (6 * h + 8) + 4 * s * b * V + 8 * s * b
    assert activation_bytes_per_device(NANO, L, "bf16-mixed") == expected
    with_scores = replace(NANO, attention="math")     # no dropout: the softmax output only
    assert (activation_bytes_per_device(with_scores, L, "bf16-mixed") - expected
            == 2 * (2 * a * s * s * b - 4 * a * s * b))


def test_pipeline_first_stage_holds_p_micro_batches():
    m = ModelSpec.from_shape(8, 64, 4, 256, 64, attention="math", dropout=0.1)
    one = activation_bytes_per_device(m, layout("ddp", m, 1), "bf16-mixed")
    L = layout("pipeline", m, 4, micro_batches=8)
    per_layer = 64 * 64 * 34 + 5 * 4 * 64 * 64
    # + the stage's own tensors: 4 in-flight outputs and 8 gradient receive buffers, fp32 residual
    # stream of one micro-batch each (64 x 64 x 4 bytes)
    stage = 12 * 64 * 64 * 4
    assert activation_bytes_per_device(m, L, "bf16-mixed") == 2 * per_layer * 4 + 64 * 64 * 4 + stage
    assert activation_bytes_per_device(m, L, "bf16-mixed") < one + 4 * 64 * 64 * 4 + stage


# ---------------------------------------------------------------- communication (ring, nccl-tests)
def test_ring_bus_factors_and_cost():
    c = Collective("x", "all_reduce", "dp", 8, 1e9, 1, False)
    assert c.bus_factor == 2 * 7 / 8 and c.hops == 14
    assert c.time_s(100e9, 1e-6) == pytest.approx(14e-6 + 1.75e9 / 100e9)
    for op in ("all_gather", "reduce_scatter"):
        c = Collective("x", op, "dp", 8, 1e9, 2, False)
        assert c.bytes_per_step == pytest.approx(2 * 7 / 8 * 1e9) and c.hops == 7


def test_ddp_all_reduces_fp32_gradients_once_per_step():
    m = ModelSpec(100_000_000, 4, 1024, 16, 50257, 1024)
    L = layout("ddp", m, 8, micro_batch=1, global_batch=32)       # 4 accumulation steps
    (c,) = collectives(m, get_strategy("ddp"), L, "bf16-mixed")
    assert c.op == "all_reduce" and c.overlappable
    assert c.bytes_per_step == pytest.approx(2 * 7 / 8 * 4e8)
    assert c.calls == 1 + math.ceil((4e8 - 2 ** 20) / (25 * 2 ** 20))


def test_zero3_moves_1_5x_the_data_of_zero2():
    # ZeRO paper Sec. 7: stage 1/2 = 2 Psi (reduce-scatter + all-gather), stage 3 = 3 Psi when
    # every layer is released after its forward and gathered again in the backward. DeepSpeed's
    # defaults (stage3_max_reuse_distance 1e9) keep a model this size gathered until its backward
    # (plan/zero3_trace.py): no second gather, 2 Psi like stage 2.
    m = ModelSpec(1_000_000_000, 24, 2048, 16, 50257, 2048)
    L = layout("zero2", m, 16)
    vol = {s: sum(c.bytes_per_step for c in collectives(m, get_strategy(s), L, "bf16-mixed"))
           for s in ("zero1", "zero2", "zero3", "ddp")}
    release = get_strategy("zero3", {"stage3_max_reuse_distance": 0, "stage3_prefetch_bucket_size": 0})
    released = sum(c.bytes_per_step for c in collectives(m, release, L, "bf16-mixed"))
    assert vol["zero2"] == pytest.approx(2 * 15 / 16 * 2e9)       # 16-bit, (n-1)/n each
    assert vol["zero1"] == pytest.approx(vol["zero2"])
    assert released == pytest.approx(1.5 * vol["zero2"])
    assert vol["zero3"] == pytest.approx(vol["zero2"])
    assert vol["ddp"] == pytest.approx(2 * vol["zero2"])           # fp32 gradients under autocast


def test_fsdp_gathers_the_blocks_again_in_the_backward_not_the_root():
    # strategies/fsdp.py: FSDP2's root (embeddings, final norm, head) stays gathered from its
    # forward to the backward. 4 x 256 GPT, vocab 256, context 128: 3,257,856 parameters, of
    # which the Blocks hold 4 x 789,760 = 3,159,040 and the root 98,816.
    m = ModelSpec.from_shape(4, 256, 8, 256, 128)
    assert (m.n_params, m.n_layers * m.layer_params) == (3_257_856, 3_159_040)
    L = layout("fsdp", m, 4, micro_batch=2, global_batch=16)       # 2 micro-batches
    c = {x.name: x for x in collectives(m, get_strategy("fsdp"), L, "bf16-mixed")}
    assert (c["param_all_gather_fwd"].calls, c["param_all_gather_bwd"].calls) == (5 * 2, 4 * 2)
    assert c["param_all_gather_bwd"].bytes_per_step / c["param_all_gather_fwd"].bytes_per_step == \
        pytest.approx(3_159_040 / 3_257_856)
    assert "param_all_gather_bwd" not in {x.name for x in collectives(m, get_strategy("fsdp_grad_op"), L, "bf16-mixed")}
    # a model without Blocks is one unit, the root: never gathered again in the backward
    mlp = ModelSpec(1_000_000, 4, 512, 1, 10, 1, kind="mlp")
    Lm = layout("fsdp", mlp, 4, micro_batch=2, global_batch=8)
    names = {x.name for x in collectives(mlp, get_strategy("fsdp"), Lm, "32")}
    assert "param_all_gather_fwd" in names and "param_all_gather_bwd" not in names


def test_tensor_parallel_collectives_per_layer():
    """scalelab's TP (counted on the real modules: test_plan_tp_comm_counts.py), L 4, b s h =
    4 x 128 x 256, V 256, t 2, 2 micro-batches, bf16 autocast on a GPU (plain tp at dp 1):
    row-parallel outputs and logits 16-bit, the embedding sum and the LayerNorm outputs fp32."""
    m = ModelSpec.from_shape(4, 256, 8, 256, 128)
    L = layout("tp", m, 2, micro_batch=4, global_batch=8)          # 2 micro-batches
    bsh, bsv = 4 * 128 * 256, 4 * 128 * 256
    # without sp: 2 all-reduces per Block forward, 4 backward (q, k, v, up: the old model's
    # 4 L + 2 = 18 all-reduces of bsh x 2 had Megatron's fused qkv and one dtype), + embedding, +
    # the head's input gradient; the logits all-gathered
    c = {x.name: x for x in collectives(m, get_strategy("tp"), replace(L, sequence_parallel=False), "bf16-mixed")}
    assert {k: (x.op, x.bytes_per_call, x.calls) for k, x in c.items()} == {
        "tp_row_all_reduce": ("all_reduce", bsh * 2, 2 * 4 * 2),
        "tp_embedding_all_reduce": ("all_reduce", bsh * 4, 1 * 2),
        "tp_logits_all_gather": ("all_gather", bsv * 2, 1 * 2),
        "tp_column_grad_all_reduce": ("all_reduce", bsh * 4, (4 * 4 + 1) * 2)}
    assert not any(x.overlappable for x in c.values())
    # sp (Layout's default): per Block 2 all-gathers + 2 reduce-scatters forward and backward, lm_head
    # gathers its input (and reduce-scatters its gradient), the first Block all-gathers the
    # embedding gradient; plain tp reduces no LayerNorm gradients
    c = {x.name: x for x in collectives(m, get_strategy("tp"), L, "bf16-mixed")}
    assert {k: (x.op, x.bytes_per_call, x.calls) for k, x in c.items()} == {
        "tp_embedding_all_reduce": ("all_reduce", bsh * 4, 2),
        "tp_norm_all_gather": ("all_gather", bsh * 4, (2 * 4 + 1) * 2),
        "tp_row_reduce_scatter": ("reduce_scatter", bsh * 2, 2 * 4 * 2),
        "tp_logits_all_gather": ("all_gather", bsv * 2, 2),
        "tp_norm_grad_reduce_scatter": ("reduce_scatter", bsh * 4, (2 * 4 + 1) * 2),
        "tp_row_grad_all_gather": ("all_gather", bsh * 2, 2 * 4 * 2),
        "tp_embedding_grad_all_gather": ("all_gather", bsh * 4, 2)}


def test_pipeline_sends_activations_both_ways_per_micro_batch():
    m = ModelSpec.from_shape(4, 256, 8, 256, 128)
    L = layout("pipeline", m, 2, micro_batch=2, micro_batches=4)
    p2p = [c for c in collectives(m, get_strategy("pipeline"), L, "32") if c.op == "p2p"][0]
    # 2 stages: rank 0 sends 4 activations forward, rank 1 sends 4 gradients back (each rank 4,
    # as counted on torch's stage sends: 12 per rank in 3 steps of 4 micro-batches; not 2 x 4)
    assert p2p.calls == 4 and p2p.bytes_per_call == 2 * 128 * 256 * 4


def test_groups_cross_nodes_in_megatron_rank_order():
    m = ModelSpec.from_shape(8, 256, 8, 256, 128)
    L = layout("fsdp_tp", m, 8, nodes=4, tp=8)
    assert not L.group_spans_nodes("tp") and L.group_spans_nodes("dp") and L.dp == 4


def test_ddp_variants_compress_or_skip_the_gradient_all_reduce():
    m = ModelSpec.from_shape(2, 64, 4, 256, 64)
    vol = {s: sum(c.bytes_per_step for c in collectives(m, get_strategy(s), layout(s, m, 2), "32"))
           for s in ("ddp", "ddp_compress", "local_sgd")}
    assert vol["ddp_compress"] == pytest.approx(vol["ddp"] / 2)          # bf16 buckets
    assert vol["local_sgd"] == pytest.approx(vol["ddp"] / 4)             # params every 4 steps


def test_powersgd_sends_rank_r_factors():
    from scalelab.plan.comm import powersgd_elements
    # 1 layer, h 64, f 256, V 256, s 64, rank 1: matrices 192x64, 64x64, 256x64, 64x256, the
    # embedding 256x64 and positions 64x64 -> r (n + m) = 256+128+320+320+320+128 = 1472 values;
    # they hold 69,632 of the 70,592 parameters, the other 960 (biases, norms) go uncompressed.
    m = ModelSpec.from_shape(1, 64, 4, 256, 64)
    assert m.n_params == 70_592
    assert powersgd_elements(m, 1) == 960 + 1472
    # A matrix that rank-r factors would not shrink 2x is sent whole (torch min_compression_rate).
    assert powersgd_elements(ModelSpec(100, 1, 4, 1, 1, 1, kind="mlp"), 2) == 100

"""The planner's step peak against the allocator's, on the CPU: torch's profiler records every
allocation and free of the CPU allocator with its running total ("[memory]" events,
profile_memory=True), the CPU's counterpart of torch.cuda.max_memory_allocated. One forward, loss
and backward of scalelab's GPT as `single` runs it (LitModule: cross entropy on logits.float(), the
logits gone before backward; gradients freed after the previous step), measured from the step's
start, when only parameters are allocated. The planner's figure for the same: its peak of
gradients and activations (peak_states_and_activations less parameters and optimizer state) plus
its buffers (autocast's 16-bit weight copies). Expected values come from the allocator, never from
the planner.

Full recompute: late in backward block k is recomputed beside the gradients of the head and the
blocks above it and the stored inputs of blocks 0..k (peak_memory._late_moment); autocast's cast cache holds every
16-bit weight copy (of the Linear layers: embeddings and LayerNorms stay fp32) to the forward's end,
then only the recomputed block's (and the head's, saved by its matmul, at the cross entropy's
backward: model_states.copies_gone_at_head). Gradients alive through the forward (an accumulation's second
micro-batch): backward makes the head's new gradient beside the accumulated ones.

What it guards: the head. The cross entropy's backward makes two fp32 gradients of s x b x V
(nll_loss_backward, _log_softmax_backward_data) while every saved activation and the saved
log-softmax are alive; with a byte vocabulary that hides in the noise (the H200 runs), with 32k
tokens it is two thirds of this peak (the planner without it: 0.35 of the allocator's).
"""
import contextlib
import json

import pytest
import torch
import torch.nn.functional as F

from scalelab.models.gpt import GPT, GPTConfig
from scalelab.plan import ModelSpec, build_terms
from scalelab.plan.peak_memory import peak_states_and_activations

TOLERANCE = 0.02
# Full recompute under autocast: the planner 1.007-1.026 of the allocator on an AMD EPYC with
# AVX512-BF16 (2026-12-02), 0.998-1.000 on the CPU of the first measurements (2026-12-01): which
# tensor oneDNN's bf16 path spares there at the binding moment is not found yet.
BF16_FULL_TOLERANCE = 0.03


def tolerance(precision: str, ckpt: str) -> float:
    return BF16_FULL_TOLERANCE if precision == "bf16-mixed" and ckpt == "full" else TOLERANCE
# (layers, width, heads, context, vocabulary, batch)
SHAPES = [(2, 64, 4, 128, 256, 2), (2, 64, 4, 128, 32768, 2), (4, 128, 4, 256, 256, 4),
          (2, 256, 8, 128, 4096, 4), (3, 96, 2, 256, 2048, 1)]
# The largest shapes of each test (4-15 s each on 2 cores under the profiler) run with -m slow;
# the default suite keeps at least one shape of each kind each test was written for.
SLOW = {(4, 128, 4, 256, 256, 4), (8, 128, 4, 256, 256, 4), (6, 64, 2, 512, 256, 8), (2, 1024, 8, 8, 256, 1)}


def shapes(listed: list, slow_too: tuple = ()) -> list:
    """pytest params of `listed`, those in SLOW (or `slow_too`) marked slow."""
    return [pytest.param(s, marks=pytest.mark.slow if s in SLOW or s in slow_too else (),
                         id="L{}-h{}-a{}-s{}-V{}-b{}".format(*s)) for s in listed]


def allocator_peak(shape, precision: str, ckpt: str, tmp_path, grads_alive: bool = False) -> int:
    from torch.profiler import ProfilerActivity, profile

    L, h, a, s, V, b = shape
    torch.manual_seed(0)
    net = GPT(GPTConfig(n_layers=L, d_model=h, n_heads=a, seq_len=s, vocab_size=V, activation_checkpointing=ckpt))
    if precision == "bf16-true":      # as Lightning's bf16-true precision runs it: the module itself in bf16
        net = net.to(torch.bfloat16)
    tokens = torch.randint(0, V, (b, s + 1))
    autocast = (lambda: torch.autocast("cpu", dtype=torch.bfloat16)) if precision == "bf16-mixed" \
        else contextlib.nullcontext

    def loss():                       # as LitModule.training_step: its logits are gone before backward
        with autocast():
            logits = net(tokens[:, :-1])
            return F.cross_entropy(logits.float().reshape(-1, V), tokens[:, 1:].reshape(-1))

    loss().backward()                 # a first step: lazy initialisation out of the way
    net.zero_grad(set_to_none=True)
    with profile(activities=[ProfilerActivity.CPU], profile_memory=True) as prof:
        loss().backward()
        if grads_alive:               # an accumulation's second micro-batch, beside the first's gradients
            loss().backward()
    trace = tmp_path / "trace.json"
    prof.export_chrome_trace(str(trace))
    events = json.loads(trace.read_text())["traceEvents"]
    mem = sorted((e for e in events if e.get("name") == "[memory]"), key=lambda e: e["ts"])
    workspace = gemm_workspace(mem, events)
    total = peak = 0
    for i, e in enumerate(mem):
        if i not in workspace:
            total += e["args"]["Bytes"]
            peak = max(peak, total)
    return peak


GEMMS = ("aten::mm", "aten::addmm", "aten::bmm", "aten::baddbmm")


def gemm_workspace(mem: list, events: list) -> set[int]:
    """Indices of the [memory] events of the GEMM library's workspace: allocations made and freed
    inside one matmul op (not its output, which outlives it). The planner predicts tensors, not a
    BLAS library's scratch: oneDNN's bf16 matmul on a CPU with AVX512-BF16 takes 74,752 bytes per
    thread inside aten::mm (an AMD EPYC, 2026-12-02: 5-11 % of the smallest shape's 1.3 MB peak
    under full recompute at 1-2 threads, none on the CPU of the first measurements)."""
    spans = [(e["ts"], e["ts"] + e.get("dur", 0)) for e in events if e.get("ph") == "X" and e.get("name") in GEMMS]

    def span(ts):
        return next((sp for sp in spans if sp[0] <= ts <= sp[1]), None)

    out, made = set(), {}
    for i, e in enumerate(mem):
        if e["args"]["Bytes"] > 0:
            made[e["args"]["Addr"]] = i
            continue
        j = made.pop(e["args"]["Addr"], None)
        sp = span(mem[j]["ts"]) if j is not None else None
        if sp and sp[0] <= e["ts"] <= sp[1]:
            out |= {i, j}
    return out


def planned(shape, precision: str, ckpt: str, grads_alive: bool = False) -> float:
    """The planner's peak less what is allocated before the step: parameters."""
    L, h, a, s, V, b = shape
    n = sum(p.numel() for p in GPT(GPTConfig(n_layers=L, d_model=h, n_heads=a, seq_len=s, vocab_size=V)).parameters())
    spec = ModelSpec(n, L, h, a, V, s, 4 * h)            # the real count: an untied head
    t = build_terms(spec, "single", devices=1, micro_batch=b, global_batch=b * (2 if grads_alive else 1),
                    precision=precision, optimizer="sgd", activation_checkpointing=ckpt)
    assert t.states.grads_at_peak == grads_alive
    return peak_states_and_activations(t) - t.states.params_bytes - t.states.optimizer_bytes + t.states.buffers_bytes


@pytest.mark.parametrize("ckpt", ["none", "selective", "full"])
@pytest.mark.parametrize("precision", ["32", "bf16-mixed", "bf16-true"])
@pytest.mark.parametrize("shape", shapes(SHAPES))
def test_planner_matches_the_cpu_allocator_peak(shape, precision, ckpt, tmp_path):
    got = allocator_peak(shape, precision, ckpt, tmp_path)
    ratio = planned(shape, precision, ckpt) / got
    print(f"{shape} {precision} {ckpt}: planned / allocator = {ratio:.3f}")
    # (full recompute under autocast where the head binds: 1.000, 1.000, 0.998, measured
    # 2026-12-01; 1.04-1.11 while the head's moment still counted the blocks' weight copies)
    assert abs(ratio - 1) <= tolerance(precision, ckpt), ratio


# Full recompute where its late moment binds, over depth, batch and context: block k's backward
# holds the stored inputs of blocks 0..k only (each is freed after its block's backward) and its
# own backward's MLP-hidden gradient. Counting every stored input and no transient, the planner
# was 0.89 (1 layer) to 1.14 (8 layers) of the allocator in fp32, 0.92-1.22 under autocast; the
# test's SHAPES happened to cancel the two in fp32 (measured 2026-12-01).
DEPTHS = [(1, 128, 4, 256, 256, 4), (8, 128, 4, 256, 256, 4), (4, 128, 4, 256, 256, 1), (4, 128, 4, 512, 256, 4),
          (6, 64, 2, 512, 256, 8)]


@pytest.mark.parametrize("precision", ["32", "bf16-mixed"])
@pytest.mark.parametrize("shape", shapes(DEPTHS))
def test_full_recompute_late_moment_over_depth(shape, precision, tmp_path):
    ratio = planned(shape, precision, "full") / allocator_peak(shape, precision, "full", tmp_path)
    print(f"{shape} {precision} full: planned / allocator = {ratio:.3f}")
    assert abs(ratio - 1) <= tolerance(precision, "full"), ratio


# weight-heavy (short context): the weight copies and gradients bind, not the activations
HEAVY = [(4, 512, 8, 16, 256, 1), (2, 256, 4, 32, 4096, 1)]


@pytest.mark.parametrize("ckpt", ["none", "full"])
@pytest.mark.parametrize("precision", ["32", "bf16-mixed"])
@pytest.mark.parametrize("shape", shapes(HEAVY))
def test_gradients_alive_through_the_forward(shape, precision, ckpt, tmp_path):
    """Gradient accumulation's second micro-batch: the first one's gradients are there from the
    start (grads_at_peak: the sum); under full recompute autocast still caches every weight copy
    to the forward's end."""
    ratio = planned(shape, precision, ckpt, grads_alive=True) / allocator_peak(shape, precision, ckpt, tmp_path,
                                                                              grads_alive=True)
    print(f"{shape} {precision} {ckpt} grads alive: planned / allocator = {ratio:.3f}")
    # measured 2026-12-01: 0.998-1.020 (bf16 1.012-1.020: the 16-bit logits gradient beside the
    # fp32 one); 1.05-1.06 while the head's new gradient was counted beside the cross entropy's
    # two logits gradients, 1.21 while the head's moment counted the blocks' weight copies
    assert -TOLERANCE <= ratio - 1 <= 0.03, ratio


# Gradients freed before the forward on weight-heavy shapes: the peak is the whole gradient at
# backward's end, when every autocast weight copy is gone (each is saved for its own layer's
# backward only, and autocast's cast cache was dropped at the forward's end). Counting the copies
# there too (buffers hold them all), the planner was 1.10-1.49 of the allocator under bf16
# (measured 2026-12-01). What it leaves out is the last backward's transient: block 0's remaining
# activation gradients and, under autocast, its first Linear's 16-bit weight gradient beside the
# fp32 one (plus what the CPU's bf16 matmuls allocate, which varies with the thread count):
# 0.96-0.98 on the mid-sized (6, 384, 6, 64, 256, 2), 0.99-1.00 on the others.
FREED = [*HEAVY, (2, 1024, 8, 8, 256, 1), (8, 512, 8, 8, 256, 1), (6, 384, 6, 64, 256, 2)]


@pytest.mark.parametrize("precision,ckpt", [("32", "none"), ("bf16-mixed", "none"), ("bf16-mixed", "full")])
@pytest.mark.parametrize("shape", shapes(FREED, slow_too=HEAVY[:1]))
def test_weight_heavy_peak_is_the_gradients_without_the_weight_copies(shape, precision, ckpt, tmp_path):
    ratio = planned(shape, precision, ckpt) / allocator_peak(shape, precision, ckpt, tmp_path)
    print(f"{shape} {precision} {ckpt} grads freed: planned / allocator = {ratio:.3f}")
    assert -0.05 <= ratio - 1 <= TOLERANCE, ratio


def test_the_head_transient_by_hand(tmp_path):
    """32k vocabulary, fp32: the peak minus the same step at a 256-token vocabulary is the head's
    growth: log-softmax + two gradients (12 bytes per logit) + the final LayerNorm's unchanged part
    cancels; lm_head's and tok_emb's weight gradients (2 h V x 4 bytes) come later, after the
    activations are freed."""
    big, small = (2, 64, 4, 128, 32768, 2), (2, 64, 4, 128, 256, 2)
    grown = allocator_peak(big, "32", "none", tmp_path) - allocator_peak(small, "32", "none", tmp_path)
    assert grown == pytest.approx(12 * 128 * 2 * (32768 - 256), rel=0.001)

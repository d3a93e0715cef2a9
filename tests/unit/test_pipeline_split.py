"""Pipeline stage splits (strategy.split), interleaved virtual stages (strategy.stages_per_rank)
and sequence parallel (strategy.sequence_parallel): pure functions with hand-computed
expectations, one process, and the preflight / planner mapping of the new options (no rank starts).
"""
from __future__ import annotations

import itertools

import pytest
import torch

from scalelab.errors import ConfigError
from scalelab.models.gpt import GPT, GPTConfig
from scalelab.plan import ModelSpec
from scalelab.plan.flops import balanced_counts, split_costs, stage_layers
from scalelab.preflight import preflight
from scalelab.strategies.pipeline_split import layer_counts, make_stage, stage_chunks

# gpt_nano-shaped costs by hand (forward FLOPs per token, h 64, f 256, s 64):
# block 2 (4 x 64^2 + 2 x 64 x 256) + 4 x 64 x 64 = 2 (16,384 + 32,768) + 16,384 = 114,688;
# first: the embedding's position add, h = 64; last with V 1024: final LN 8 x 64 + head 2 x 64 x 1024
# + loss 4 x 1024 = 512 + 131,072 + 4,096 = 135,680 (1.18 blocks).
BLOCK, FIRST, LAST_1024 = 114_688, 64, 135_680


def test_cost_model_by_hand():
    assert split_costs(64, 256, 64, 1024) == (BLOCK, FIRST, LAST_1024)
    assert split_costs(64, 256, 64, 256)[2] == 512 + 2 * 64 * 256 + 4 * 256  # 34,304: gpt_nano's head


@pytest.mark.parametrize("layers, stages, vocab, want", [
    # V 1024, 4 layers, 2 stages: uniform [2, 2] costs [229,440, 365,056]; [3, 1] costs
    # [344,128, 250,368]: a cheaper slowest stage
    (4, 2, 1024, [3, 1]),
    # gpt_nano's own head (0.3 blocks): uniform is already the best split
    (4, 2, 256, [2, 2]),
    (8, 4, 256, [2, 2, 2, 2]),
    # 6 layers, 3 stages, V 1024: [2,2,2] -> last stage 2 x 114,688 + 135,680 = 365,056;
    # [2,3,1] -> [229,440, 344,064, 250,368]; [3,2,1] -> 344,128 (3 blocks + the embedding's 64):
    # [2,3,1] has the cheapest slowest stage
    (6, 3, 1024, [2, 3, 1]),
    # every stage keeps >= 1 layer even if the head alone outweighs everything
    (3, 3, 50_000, [1, 1, 1]),
])
def test_balanced_splits_by_hand(layers, stages, vocab, want):
    arch = GPTConfig(n_layers=layers, d_model=64, n_heads=4, seq_len=64, vocab_size=vocab)
    assert layer_counts(layers, stages, "balanced", arch) == want
    assert layer_counts(layers, stages, "uniform", arch) == [layers // stages + (s < layers % stages)
                                                              for s in range(stages)]


def _brute(n, k, block, first, last):
    """Every composition of n into k parts >= 1: min bottleneck, then min sum of squares."""
    best = None
    for cuts in itertools.combinations(range(1, n), k - 1):
        counts = [b - a for a, b in zip((0, *cuts), (*cuts, n))]
        costs = [c * block + (first if i == 0 else 0) + (last if i == k - 1 else 0) for i, c in enumerate(counts)]
        key = (max(costs), sum(x * x for x in costs))
        if best is None or key < best[0]:
            best = (key, counts)
    return best[0]


@pytest.mark.parametrize("n, k", [(5, 2), (7, 3), (9, 4), (12, 4), (10, 5)])
@pytest.mark.parametrize("last", [0.0, 0.4, 1.7, 5.0])
def test_balanced_is_optimal_against_brute_force(n, k, last):
    got = balanced_counts(n, k, 1.0, 0.05, last)
    costs = [c + (0.05 if i == 0 else 0) + (last if i == k - 1 else 0) for i, c in enumerate(got)]
    want_max, want_sq = _brute(n, k, 1.0, 0.05, last)
    assert sum(got) == n and min(got) >= 1
    assert max(costs) == pytest.approx(want_max) and sum(x * x for x in costs) == pytest.approx(want_sq)


def test_planner_uses_the_same_split():
    """plan/flops.stage_layers (the planner's per-stage figures) and the strategies split alike."""
    spec = ModelSpec.from_shape(6, 64, 4, 1024, 64, 256)
    assert stage_layers(6, 3, "balanced", spec) == [2, 3, 1]
    assert stage_layers(6, 3, "uniform", spec) == [2, 2, 2]
    assert stage_layers(6, 3) == [2, 2, 2]


# -- interleaved stages -----------------------------------------------------------------------
def test_interleaved_ranks_own_every_pp_th_virtual_stage():
    """4 layers, pp 2, 2 virtual stages each (one layer per virtual stage): rank 0 runs virtual
    stages 0 and 2 (layers 0 and 2, the embeddings), rank 1 stages 1 and 3 (layers 1 and 3, head)."""
    cfg = GPTConfig(n_layers=4)
    for rank, layers in ((0, ["0", "2"]), (1, ["1", "3"])):
        net = make_stage(GPT(cfg), rank, 2, [1, 1, 1, 1], stages_per_rank=2)
        assert list(net.layers) == layers
        assert (net.tok_emb is not None) == (rank == 0) and (net.lm_head is not None) == (rank == 1)
        chunks = stage_chunks(net, rank, 2, [1, 1, 1, 1], 2)
        assert [list(c.layers) for c in chunks] == [[x] for x in layers]
        # chunks share the trimmed GPT's modules (one set of parameters for the optimizer and checkpoints)
        assert all(c.layers[k] is net.layers[k] for c in chunks for k in c.layers)


def test_chunks_in_virtual_stage_order_compute_the_plain_gpt():
    torch.manual_seed(0)
    cfg = GPTConfig(n_layers=4)
    full = GPT(cfg).eval()
    parts = []
    for rank in (0, 1):
        net = GPT(cfg)
        net.load_state_dict(full.state_dict())
        net = make_stage(net, rank, 2, [1, 1, 1, 1], stages_per_rank=2).eval()
        parts.append(stage_chunks(net, rank, 2, [1, 1, 1, 1], 2))
    idx = torch.randint(0, 256, (2, 64))
    x = idx
    for k in range(4):                         # virtual stage k runs on rank k % 2, chunk k // 2
        x = parts[k % 2][k // 2](x)
    assert torch.equal(x, full(idx))


# -- preflight: one-line errors before any rank starts ------------------------------------------
@pytest.mark.parametrize("args, words", [
    (["strategy=pipeline", "trainer.devices=2", "strategy.schedule=interleaved_1f1b"],
     ["stages_per_rank=1", "interleaved_1f1b needs stages_per_rank >= 2"]),
    (["strategy=pipeline", "trainer.devices=2", "strategy.stages_per_rank=2"], ["schedule=1f1b", "interleaved_1f1b"]),
    (["strategy=pipeline", "trainer.devices=2", "strategy.schedule=interleaved_1f1b", "strategy.stages_per_rank=2"],
     # stages_per_rank <= 1 would be no interleaving at all, which the line above refuses (review)
     ["2 x 2 = 4 virtual stages", "2 layers",
      ": use schedule=1f1b or gpipe (stages_per_rank=1), or model.arch.n_layers >= 4"]),
    (["strategy=pipeline", "trainer.devices=2", "strategy.schedule=interleaved_1f1b", "strategy.stages_per_rank=3",
      "model.arch.n_layers=4"], ["2 x 3 = 6 virtual stages", "4 layers", ": use stages_per_rank <= 2 or raise"]),
    (["strategy=pipeline", "trainer.devices=4", "model.arch.n_layers=8", "strategy.schedule=interleaved_1f1b",
      "strategy.stages_per_rank=2", "strategy.microbatches=9", "data.global_batch_size=18"],
     ["microbatches=9", "2 rounds", "choose one of 1, 2, 3, 4, 5, 6, 7, 8, 10, 12, 15, 16"]),
    (["strategy=pipeline", "trainer.devices=2", "strategy.split=greedy"], ["strategy.split", "uniform", "balanced"]),
    (["strategy=pipeline", "trainer.devices=2", "strategy.stages_per_rank=0"], ["strategy.stages_per_rank=0"]),
    (["strategy=nd", "trainer.devices=4", "strategy.pp=2", "strategy.tp=2", "strategy.schedule=interleaved_1f1b",
      "strategy.stages_per_rank=2"], ["4 virtual stages", "2 layers"]),
    (["strategy=nd", "trainer.devices=2", "strategy.schedule=interleaved_1f1b", "strategy.stages_per_rank=2",
      "model.arch.n_layers=4"], ["interleaved_1f1b needs >= 2 pipeline stages"]),
    (["strategy=tp", "trainer.devices=2", "strategy.sequence_parallel=maybe"], ["strategy.sequence_parallel"]),
    (["strategy=tp", "trainer.devices=2", "strategy.sequence_parallel=true", "model.arch.seq_len=63"],
     ["seq_len 63", "tensor_parallel_size=2", "sequence_parallel=false"]),
    (["strategy=nd", "trainer.devices=2", "strategy.tp=2", "strategy.sequence_parallel=true", "model.arch.seq_len=63"],
     ["seq_len 63", "strategy.tp=2"]),
])
def test_bad_options_fail_in_one_line(args, words):
    with pytest.raises(ConfigError) as e:
        preflight(args)
    msg = str(e.value)
    assert "\n" not in msg
    for w in words:
        assert w in msg, msg


def test_valid_new_options_pass_preflight():
    for args in (["strategy=pipeline", "trainer.devices=2", "strategy.schedule=interleaved_1f1b",
                  "strategy.stages_per_rank=2", "model.arch.n_layers=4", "strategy.split=balanced"],
                 ["strategy=pipeline", "trainer.devices=4", "model.arch.n_layers=8", "strategy.microbatches=2",
                  "strategy.schedule=interleaved_1f1b", "strategy.stages_per_rank=2"],
                 ["strategy=nd", "trainer.devices=4", "strategy.tp=2", "strategy.pp=2",
                  "strategy.sequence_parallel=true", "strategy.schedule=interleaved_1f1b",
                  "strategy.stages_per_rank=2", "model.arch.n_layers=4"],
                 ["strategy=fsdp_tp", "trainer.devices=4", "strategy.sequence_parallel=true"]):
        preflight(args)


# -- the planner reads the same options --------------------------------------------------------
def test_plan_job_maps_the_new_options():
    from scalelab.plan_job import terms_for_job

    t, _ = terms_for_job(["strategy=nd", "trainer.devices=4", "strategy.tp=2", "strategy.pp=2", "model=gpt_small",
                          "strategy.sequence_parallel=true", "strategy.split=balanced"])
    assert (t.layout.tp, t.layout.pp, t.layout.sequence_parallel, t.layout.split) == (2, 2, True, "balanced")
    t, _ = terms_for_job(["strategy=tp", "trainer.devices=2", "model=gpt_small"])
    assert t.layout.sequence_parallel is False         # the run's default, not the planner's
    t, _ = terms_for_job(["strategy=pipeline", "trainer.devices=2", "model=gpt_small",
                          "strategy.schedule=interleaved_1f1b", "strategy.stages_per_rank=2"])
    assert (t.layout.pp, t.layout.stages_per_rank, t.layout.micro_batches) == (2, 2, 4)


def test_planner_interleaved_activation_model_by_hand():
    """pp 2, v 2, m 4 (2 rounds of 2): rank 0 runs (2-1) x 2 + 2 x (2-1) = 4 warm-up forwards of
    one-layer chunks, then a fifth: 5 layer-micro-batches in flight (1F1B: 2 micro-batches of 2
    layers = 4); rank 1: 2 + 1 = 3 chunks + the head's output. Token ids (8 s b) on rank 0 for
    ceil(5 / 2) = 3 micro-batches. Plus what torch's PipelineStage holds (activations.
    pipeline_stage_bytes), in units of one micro-batch's residual stream u and logits: 1F1B rank 0
    its 2 in-flight outputs and 4 gradient receive buffers (6 u), rank 1 one logits and 3 idle
    activation buffers; interleaved, each rank's in-flight chunks spread over its 2 chunks (2.5 and
    1.5 per chunk): rank 0 5 u of outputs + 8 u of gradient buffers (both its virtual stages are
    before the last) + 1.5 u idle inputs (virtual stage 2), rank 1 1.5 u + 1.5 logits of outputs,
    4 u of gradient buffers (virtual stage 1), 2 x 2.5 u idle inputs."""
    from dataclasses import replace

    from scalelab.plan import activation_bytes_per_device, get_strategy, resolve_layout
    from scalelab.plan.activations import gpt_layer_activation_bytes

    spec = ModelSpec.from_shape(4, 64, 4, 256, 64, 256)
    layout = resolve_layout(get_strategy("pipeline"), spec, 2, micro_batch=4, micro_batches=4)
    s, b, h, V = 64, 4, 64, 256
    layer = gpt_layer_activation_bytes(s, b, h, 4, 1, e=4)
    out = (4 * s * b * h + 8 * s * b) + 4 * s * b * h + 4 * s * b * V + 8 * s * b
    u, logits = 4 * s * b * h, 4 * s * b * V
    plain = activation_bytes_per_device(spec, layout, "32")
    assert plain == pytest.approx(max(2 * (2 * layer + 8 * s * b) + 6 * u, 2 * layer + out + logits + 3 * u))
    inter = activation_bytes_per_device(spec, replace(layout, stages_per_rank=2), "32")
    assert inter == pytest.approx(max(5 * layer + 3 * 8 * s * b + 14.5 * u,
                                      3 * layer + out + 10.5 * u + 1.5 * logits))

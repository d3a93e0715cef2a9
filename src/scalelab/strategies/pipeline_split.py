"""How a pipeline cuts the GPT's layers into stages (`strategy.split` of pipeline and nd), and the
stage modules a rank builds from them (make_stage; StageChunk for interleaved virtual stages).
The cost model and the balanced search live in plan/flops.py, so the planner splits alike.

- uniform: contiguous, equal layer counts; the first n_layers % stages stages get one more
  (what torch.distributed.pipelining's own splitters and Megatron do).
- balanced: contiguous, each stage >= 1 layer, chosen so that the most expensive stage is as cheap
  as possible (it paces the pipeline: every other stage waits for it, step time ~ (m + p - 1) x
  the slowest stage), ties broken by the smallest sum of squared stage costs (the most even), then
  by the earliest stages holding more. Cost = modelled forward FLOPs per token from the model
  config (`stage_costs`): a block 2 (4 h^2 + 2 h f) + 4 s h (Narayanan et al. 2021: QKV/out and
  MLP matmuls + attention scores and values); stage 0 adds the embedding (a lookup and the
  position add: h); the last stage adds the final LayerNorm (~ 8 h: mean, variance, normalize,
  scale/shift), the LM head (2 h V) and the loss (log-softmax + NLL over the vocabulary: ~ 4 V).
  Backward is ~ 2x forward for all of them, so forward FLOPs rank the stages as the step does.

The default is uniform: the planner's parameter counts per stage (plan/model_states.py) assume
equal layer counts, and for the GPTs here (vocabulary small next to 12 h layers' worth of work)
balanced rarely differs (gpt_nano, gpt_small: the same as uniform); choose it when the head is
heavy (large vocabulary, few layers per stage), e.g. GPT-2 small (h 768, s 1024, V 50,257; the head
+ loss cost ~ 4.5 blocks) with 12 layers on 4 stages: uniform [3,3,3,3] gives the last stage ~ 7.5
blocks' FLOPs, balanced [3,4,4,1] at most ~ 5.5 (4 + stage 0's embedding tilts the tie to [3,4,4]).

With interleaving (stages_per_rank v) the split is over pp x v virtual stages in order; virtual
stage k runs on pipeline rank k % pp (torch's interleaved schedules), so stage 0 (embedding) is on
rank 0 and the last virtual stage (head) on rank pp - 1.
"""
from __future__ import annotations

from typing import Any

import torch
from torch import nn

from scalelab.plan.flops import SPLITS, balanced_counts, split_costs as stage_costs, uniform_counts  # noqa: F401


def layer_counts(n_layers: int, stages: int, split: str = "uniform", arch: Any = None) -> list[int]:
    """Layers per stage for `split` (arch: a GPTConfig, needed for balanced)."""
    if split == "uniform" or arch is None:
        return uniform_counts(n_layers, stages)
    return balanced_counts(n_layers, stages, *stage_costs(arch.d_model, arch.mlp_ratio * arch.d_model,
                                                          arch.seq_len, arch.vocab_size))


def layer_ranges(counts: list[int]) -> list[list[int]]:
    out, start = [], 0
    for n in counts:
        out.append(list(range(start, start + n)))
        start += n
    return out


def modelled_costs(counts: list[int], arch: Any) -> list[float]:
    """Modelled forward FLOPs per token of each stage (for run.json, next to the measured bubble)."""
    block, first, last = stage_costs(arch.d_model, arch.mlp_ratio * arch.d_model, arch.seq_len, arch.vocab_size)
    return [n * block + (first if i == 0 else 0.0) + (last if i == len(counts) - 1 else 0.0)
            for i, n in enumerate(counts)]


def split_layers(n_layers: int, stages: int, counts: list[int] | None = None) -> list[list[int]]:
    """Contiguous layer ranges: `counts` per stage, or equal counts (the first n_layers % stages
    stages get one more layer)."""
    return layer_ranges(counts or layer_counts(n_layers, stages))


def make_stage(net: nn.Module, stage: int, stages: int, counts: list[int] | None = None,
               stages_per_rank: int = 1) -> nn.Module:
    """Trim a plain GPT in place to what pipeline rank `stage` of `stages` runs: its stage, or with
    stages_per_rank v its virtual stages stage, stage + stages, ... of stages x v (`counts`: layers
    per (virtual) stage; default equal). Returns the trimmed GPT."""
    total = stages * stages_per_rank
    ranges = split_layers(len(net.layers), total, counts)
    own = {str(i) for v in range(stages_per_rank) for i in ranges[stage + v * stages]}
    for key in [k for k in net.layers.keys() if k not in own]:
        del net.layers[key]
    if stage > 0:
        net.tok_emb = None
        net.pos_emb = None
    if stage < stages - 1:
        net.ln_f = None
        net.lm_head = None
    return net


class StageChunk(nn.Module):
    """One virtual stage of an interleaved pipeline: the trimmed GPT's modules for its layers (and
    the ends when it is the first / last stage), shared, not copied; runs GPT.forward on them."""

    def __init__(self, net: nn.Module, layer_ids: list[int], first: bool, last: bool):
        super().__init__()
        self.cfg = net.cfg
        self.tok_emb, self.pos_emb = (net.tok_emb, net.pos_emb) if first else (None, None)
        self.layers = nn.ModuleDict({str(i): net.layers[str(i)] for i in layer_ids})
        self.ln_f, self.lm_head = (net.ln_f, net.lm_head) if last else (None, None)

    def forward(self, idx: torch.Tensor) -> torch.Tensor:
        from scalelab.models.gpt import GPT

        return GPT.forward(self, idx)


def stage_chunks(net: nn.Module, stage: int, stages: int, counts: list[int], stages_per_rank: int) -> list:
    """The StageChunks of pipeline rank `stage` (virtual stages stage + v x stages, in order)."""
    total = stages * stages_per_rank
    ranges = layer_ranges(counts)
    ids = [stage + v * stages for v in range(stages_per_rank)]
    return [StageChunk(net, ranges[k], k == 0, k == total - 1) for k in ids]

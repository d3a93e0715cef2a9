"""FLOPs per training step.

Source: Narayanan et al. 2021, "Efficient Large-Scale Language Model Training on GPU Clusters Using
Megatron-LM" (arXiv:2104.04473), Sec. 5.1 / Appendix. A transformer layer's forward pass costs
24 B s h^2 + 4 B s^2 h FLOPs (matmuls only, MLP width 4h); backward costs twice the forward; the
output projection costs 2 B s h V forward. Per iteration of batch B:

    without recomputation   F = 72 B s l h^2 (1 + s / (6 h) + V / (12 l h))
    with full recomputation F = 96 B s l h^2 (1 + s / (6 h) + V / (16 l h))   (the paper's Eq. 3)

Model FLOPs (what MFU counts, Chowdhery et al. 2022, PaLM App. B) exclude recomputation; hardware
FLOPs (what the device actually executes) include it. Selective recomputation (Korthikanti et al.
2022) re-runs only the attention core: 4 B s^2 h extra per layer.
We write the layer cost for a general MLP width f: 2 B s (4 h^2 + 2 h f) + 4 B s^2 h, which is the
paper's 24 B s h^2 + 4 B s^2 h at f = 4h. MLP models: 6 N FLOPs per sample (2 N fwd, 4 N bwd).
"""
from __future__ import annotations

from .spec import ModelSpec


def layer_forward_flops(model: ModelSpec, tokens: float) -> float:
    """Forward FLOPs of one transformer block for `tokens` = B s tokens."""
    h, s, f = model.hidden, model.seq_len, model.ffn
    return 2 * tokens * (4 * h * h + 2 * h * f) + 4 * tokens * s * h


def forward_flops(model: ModelSpec, samples: float) -> float:
    """Forward FLOPs for `samples` sequences (layers + output projection)."""
    if model.kind == "mlp":
        return 2 * model.n_params * samples
    tokens = samples * model.seq_len
    return model.n_layers * layer_forward_flops(model, tokens) + 2 * tokens * model.hidden * model.vocab


def model_flops(model: ModelSpec, samples: float) -> float:
    """Model FLOPs of a training step on `samples` sequences: forward + backward (2x forward)."""
    return 3 * forward_flops(model, samples)


def megatron_flops(B: float, s: int, l: int, h: int, V: int, recompute: bool = False) -> float:
    """The paper's closed form (MLP width 4h), kept verbatim for tests and for reference."""
    if recompute:
        return 96 * B * s * l * h * h * (1 + s / (6 * h) + V / (16 * l * h))
    return 72 * B * s * l * h * h * (1 + s / (6 * h) + V / (12 * l * h))


def hardware_flops(model: ModelSpec, samples: float, checkpointing: str = "none") -> float:
    """FLOPs actually executed: model FLOPs + recomputed forward work."""
    f = model_flops(model, samples)
    if model.kind == "mlp" or checkpointing == "none":
        return f
    tokens = samples * model.seq_len
    if checkpointing == "full":
        return f + model.n_layers * layer_forward_flops(model, tokens)   # one more forward of the blocks
    return f + model.n_layers * 4 * tokens * model.seq_len * model.hidden  # selective: attention core


SPLITS = ("uniform", "balanced")


def uniform_counts(n_layers: int, stages: int) -> list[int]:
    base, extra = divmod(n_layers, stages)
    return [base + (1 if s < extra else 0) for s in range(stages)]


def split_costs(h: int, f: int, s: int, vocab: int) -> tuple[float, float, float]:
    """(per block, stage 0's extra, last stage's extra) forward FLOPs per token, the cost model of
    the balanced split (scalelab.strategies.pipeline_split explains each term)."""
    block = 2 * (4 * h * h + 2 * h * f) + 4 * s * h
    return float(block), float(h), float(8 * h + 2 * h * vocab + 4 * vocab)


def balanced_counts(n_layers: int, stages: int, block: float, first: float, last: float) -> list[int]:
    """Layer counts per stage (each >= 1) minimising the costliest stage, then the sum of squared
    stage costs, then preferring more layers on earlier stages. Exact: dynamic programmes over the
    cut points (stages x layers^2, trivial for any real model)."""
    if stages == 1:
        return [n_layers]

    def cost(stage: int, n: int) -> float:
        return n * block + (first if stage == 0 else 0.0) + (last if stage == stages - 1 else 0.0)

    # 1. the smallest achievable bottleneck: best[k][i] = min over splits of i layers into k stages
    inf = float("inf")
    best = [[inf] * (n_layers + 1) for _ in range(stages + 1)]
    best[0][0] = 0.0
    for k in range(1, stages + 1):
        for i in range(k, n_layers - (stages - k) + 1):
            best[k][i] = min(max(best[k - 1][i - n], cost(k - 1, n)) for n in range(1, i - k + 2))
    bound = best[stages][n_layers] * (1 + 1e-12)
    # 2. under that bound, the most even split (smallest sum of squares); ties: earlier stages heavier
    sq: dict[tuple[int, int], tuple[float, tuple[int, ...]]] = {(0, 0): (0.0, ())}
    for k in range(1, stages + 1):
        for i in range(k, n_layers - (stages - k) + 1):
            options = []
            for n in range(1, i - k + 2):
                c = cost(k - 1, n)
                prev = sq.get((k - 1, i - n))
                if prev is None or c > bound:
                    continue
                options.append((prev[0] + c * c, tuple(-x for x in prev[1]) + (-n,), prev[1] + (n,)))
            if options:
                s, _, counts = min(options)
                sq[(k, i)] = (s, counts)
    return list(sq[(stages, n_layers)][1])


def stage_layers(n_layers: int, pp: int, split: str = "uniform", model: ModelSpec | None = None) -> list[int]:
    """Layers per pipeline stage, as the pipeline / nd strategies split them (`strategy.split`):
    uniform: contiguous, equal counts, the first n_layers % pp stages get one more (torch's
    pipelining splits alike); balanced: equal modelled FLOPs (balanced_counts; needs the model).
    Stage 0 also holds the embeddings (cheap lookups), the last stage the LM head."""
    if split == "balanced" and model is not None and model.kind == "gpt":
        return balanced_counts(n_layers, pp, *split_costs(model.hidden, model.ffn, model.seq_len, model.vocab))
    return uniform_counts(n_layers, pp)


def slowest_stage(model: ModelSpec, pp: int, split: str = "uniform") -> tuple[int, bool]:
    """(layers, holds the LM head) of the stage with the most forward FLOPs, which paces a
    pipeline. With 3 layers on 2 stages that is stage 0's two layers, not 2 layers + the head."""
    if pp <= 1:
        return model.n_layers, True
    layer = layer_forward_flops(model, model.seq_len)
    head = 2 * model.seq_len * model.hidden * model.vocab if model.kind == "gpt" else 0.0
    loads = [(n * layer + (head if s == pp - 1 else 0.0), n, s == pp - 1)
             for s, n in enumerate(stage_layers(model.n_layers, pp, split, model))]
    _, n, last = max(loads)
    return n, last

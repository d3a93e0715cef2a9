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


def stage_layers(n_layers: int, pp: int) -> list[int]:
    """Layers per pipeline stage, contiguous and balanced: the first n_layers % pp stages get one
    more (scalelab.strategies.pipeline.split_layers; torch.distributed.pipelining splits alike).
    Stage 0 also holds the embeddings (cheap lookups), the last stage the LM head."""
    base, extra = divmod(n_layers, pp)
    return [base + (1 if s < extra else 0) for s in range(pp)]


def slowest_stage(model: ModelSpec, pp: int) -> tuple[int, bool]:
    """(layers, holds the LM head) of the stage with the most forward FLOPs, which paces a
    pipeline. With 3 layers on 2 stages that is stage 0's two layers, not 2 layers + the head."""
    if pp <= 1:
        return model.n_layers, True
    layer = layer_forward_flops(model, model.seq_len)
    head = 2 * model.seq_len * model.hidden * model.vocab if model.kind == "gpt" else 0.0
    loads = [(n * layer + (head if s == pp - 1 else 0.0), n, s == pp - 1)
             for s, n in enumerate(stage_layers(model.n_layers, pp))]
    _, n, last = max(loads)
    return n, last

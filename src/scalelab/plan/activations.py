"""Activation memory per device.

Source: Korthikanti et al. 2022, "Reducing Activation Recomputation in Large Transformer Models"
(arXiv:2205.05198), Sec. 4 and Table 2. Per transformer layer, sequence length s, micro-batch b,
hidden h, heads a, tensor-parallel degree t, 16-bit activations, with dropout:

    no parallelism                      s b h (34 + 5 a s / h)
    tensor parallel                     s b h (10 + 24 / t + 5 a s / (h t))
    tensor + sequence parallel          s b h (34 / t + 5 a s / (h t))
    + selective recompute (attention)   drops the 5 a s / h term
    full recompute                      2 s b h (only the layer input; / t with sequence parallel)

Where the numbers come from (bytes): 10 s b h is replicated across TP ranks without sequence
parallelism: four 16-bit tensors (two LayerNorm inputs, the QKV input, the MLP input) and two
1-byte dropout masks; 24 s b h is split: Q, K, V, the projection input (4 x 2 bytes) and the MLP's
two 4h-wide tensors (2 x 8 bytes); 5 a s^2 b is softmax output + dropout output (2 x 2 bytes) and
the dropout mask (1 byte). We keep that decomposition so fp32 training (4-byte activations; masks
stay 1 byte) and an MLP width other than 4h are counted correctly. FlashAttention (Dao et al. 2022)
never stores the s x s scores either: plan such a model with --activation-checkpointing selective.

Pipeline (Narayanan et al. 2021, 1F1B schedule): the first stage holds activations of min(p, m)
in-flight micro-batches of its L/p layers, i.e. about L layers' worth in total.
Embedding and output layer (Korthikanti Sec. 4.3): the embedding dropout mask (s b h bytes) per
in-flight micro-batch on the first stage; the last stage keeps the final LayerNorm and output
projection inputs (4 s b h) and the fp32 logits for the cross entropy (4 s b V), both / t.
"""
from __future__ import annotations

from .flops import slowest_stage, stage_layers
from .spec import Layout, ModelSpec


def layer_activation_bytes(s: int, b: int, h: int, a: int, t: int = 1, *, e: int = 2,
                           ffn: int | None = None, sequence_parallel: bool = False,
                           checkpointing: str = "none") -> float:
    """Bytes one transformer layer keeps for backward, per micro-batch, on one TP rank."""
    f = ffn or 4 * h
    if checkpointing == "full":
        # Only the layer input is kept (e bytes per element); split t-ways with sequence parallel.
        return e * s * b * h / (t if sequence_parallel else 1)
    replicated = s * b * h * (4 * e + 2)                 # LN inputs x2, QKV in, MLP in; 2 masks
    split = s * b * h * (4 * e + 2 * e * f / h)          # Q, K, V, proj in; fc1 out, gelu out
    scores = a * s * s * b * (2 * e + 1)                 # softmax out, dropout out, dropout mask
    if checkpointing == "selective":
        scores = 0.0                                     # recomputed in backward
    if sequence_parallel:
        return (replicated + split + scores) / t
    return replicated + split / t + scores / t


def activation_bytes_per_device(model: ModelSpec, layout: Layout, precision: str,
                                checkpointing: str = "none") -> float:
    e = 4 if precision == "32" else 2
    b, t, p = layout.micro_batch, layout.tp, layout.pp
    if model.kind == "mlp":
        # Per linear layer: its input, the pre-activation and the activation output.
        return 3 * e * b * model.hidden * model.n_layers
    s, h = model.seq_len, model.hidden
    sp = layout.sequence_parallel and t > 1
    per_layer = layer_activation_bytes(s, b, h, model.heads, t, e=e, ffn=model.ffn,
                                       sequence_parallel=sp, checkpointing=checkpointing)
    per_stage = stage_layers(model.n_layers, p)         # first stage gets any extra layer
    in_flight = min(p, layout.micro_batches)            # 1F1B warm-up depth on the first stage
    first = per_layer * per_stage[0] * in_flight + s * b * h * in_flight  # + embedding mask
    output = 4 * s * b * h / t + 4 * s * b * model.vocab / t
    if p == 1:
        return first + output
    last = per_layer * per_stage[-1] + output
    return max(first, last)


def activation_traffic_bytes(model: ModelSpec, layout: Layout, precision: str,
                             checkpointing: str = "none") -> float:
    """Activation bytes one device writes in the forward passes of one optimizer step (all its
    micro-batches, its own layers and TP share, the output layer on the last stage).

    Elementwise work (LayerNorm, GELU, softmax, residual adds, their gradients) is memory-bound:
    its time is this traffic over memory bandwidth, not FLOPs over peak (the roofline model,
    Williams et al. 2009, CACM 52(4)). It is what makes small-width models slower than their
    FLOPs say. Recomputation writes the recomputed layers' activations a second time."""
    e = 4 if precision == "32" else 2
    b, t = layout.micro_batch, layout.tp
    if model.kind == "mlp":
        per_micro = 3 * e * b * model.hidden * model.n_layers
    else:
        s, h = model.seq_len, model.hidden
        sp = layout.sequence_parallel and t > 1
        per_layer = layer_activation_bytes(s, b, h, model.heads, t, e=e, ffn=model.ffn,
                                           sequence_parallel=sp)
        layers, has_head = slowest_stage(model, layout.pp)     # the stage that paces a pipeline
        if checkpointing == "full":
            per_layer *= 2
        elif checkpointing == "selective":
            per_layer += _score_bytes(s, b, model.heads, t, e)
        head = (4 * s * b * h + 4 * s * b * model.vocab) / t if has_head else 0.0
        per_micro = per_layer * layers + head
    return per_micro * layout.micro_batches


def _score_bytes(s: int, b: int, a: int, t: int, e: int) -> float:
    """Attention scores' bytes (softmax and dropout outputs + mask) of one layer, micro-batch."""
    return a * s * s * b * (2 * e + 1) / t

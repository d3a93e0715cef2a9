"""Activation memory per device: the bytes autograd keeps from forward to backward.

Two formulas, chosen by the model's attention kernel and dropout (ModelSpec.attention / .dropout):

1. attention="math" with dropout > 0: Korthikanti et al. 2022, "Reducing Activation Recomputation
in Large Transformer Models" (arXiv:2205.05198), Sec. 4 and Table 2, unchanged (`layer_activation_bytes`).
Per layer, sequence length s, micro-batch b, hidden h, heads a, tensor-parallel degree t, 16-bit
activations, Megatron's GPT (dropout after attention, MLP and embedding; s x s scores stored):

    no parallelism                      s b h (34 + 5 a s / h)
    tensor parallel                     s b h (10 + 24 / t + 5 a s / (h t))
    tensor + sequence parallel          s b h (34 / t + 5 a s / (h t))
    + selective recompute (attention)   drops the 5 a s / h term
    full recompute                      2 s b h (only the layer input; / t with sequence parallel)

10 s b h is replicated across TP ranks without sequence parallelism: four 16-bit tensors (two
LayerNorm inputs, the QKV input, the MLP input) and two 1-byte dropout masks; 24 s b h is split:
Q, K, V, the projection input (4 x 2 bytes) and the MLP's two 4h-wide tensors (2 x 8 bytes);
5 a s^2 b is softmax output + dropout output (2 x 2 bytes) and the dropout mask (1 byte). fp32
doubles the tensors, not the masks; an MLP width f other than 4h scales the 4h-wide pair.

2. Otherwise (the default: flash attention, no dropout), what scalelab's GPT (models/gpt.py: F.scaled_
dot_product_attention, is_causal, dropout only inside it) saves under torch autocast, counted with
saved_tensors_hooks in tests/unit/test_plan_saved_tensors.py. e = 2 bytes (16-bit autocast) or 4
(fp32); the residual stream stays fp32 under autocast (embeddings, residual adds and LayerNorm run
in fp32), so r = 4 either way. Per layer:

    LayerNorm inputs (ln1, ln2)           2 r s b h       replicated (/ t with sequence parallel)
    LayerNorm mean + rstd (fp32)          16 s b          replicated (/ t with sequence parallel)
    LayerNorm outputs                     (c + 1) e s b h replicated, also with sequence parallel
                                                          (see below); c = 3 under autocast: q, k
                                                          and v each cast ln1's fp32 output
                                                          themselves (c = 1 in fp32: one tensor)
    q, k, v; attention output             4 e s b h       split (/ t); out_proj's input is a view
                                                          of the kernel's output, counted once
    MLP up output, GELU output            2 e f s b       split
    attention core, flash                 4 a s b         fp32 logsumexp per head and position
    attention core, math                  e a s^2 b       the softmax output (s x s per head)

i.e. with f = 4h: s b (40 h + 16 + 4 a) under autocast, s b (64 h + 16 + 4 a) in fp32.
Sequence parallel as scalelab's tp/fsdp_tp/nd apply it (torch's SequenceParallel on the
LayerNorms, PrepareModuleInput all-gathering the attention and MLP inputs, as torchtitan): the
LayerNorm inputs and statistics are sequence shards (/ t), but the gathered LayerNorm outputs are
saved whole by the column-parallel matmuls, so only (2 r h + 16) s b of the replicated part
shrinks (Korthikanti's "everything / t" needs Megatron's re-gather in backward). Measured with
saved_tensors_hooks on 2 gloo ranks (tests/integration/test_sequence_parallel.py; fp32, h 64,
s 128, b 2, t 2): 593,920 bytes per layer with SP vs 661,504 without, both exactly this formula. Flash and
memory-efficient kernels (Dao et al. 2022) recompute the scores in backward and regenerate a
dropout mask from the RNG state, so flash + dropout stores no mask. (On CPU, torch runs dropout > 0
with the math kernel; plan such a run with attention="math".) Selective recompute drops the
attention core's own tensors (scores or logsumexp); its inputs q, k, v and its output stay.
Full recompute (torch.utils.checkpoint per block, use_reentrant=False) keeps each block's input:
r s b h, 4 bytes even under autocast; backward recomputes one block at a time on top of that.
Per micro-batch: the token ids (int64, 8 s b) for the embedding's backward on the first stage; on
the last stage the final LayerNorm's input (r s b h), stats (8 s b) and output (e s b h, the
lm_head input), the fp32 log-softmax of the logits (4 s b V: LitModule's cross entropy runs on
logits.float()) and the int64 targets (8 s b). Not activations, so not here: autocast's 16-bit
copies of the weights, which autograd also keeps until backward (2 bytes per parameter: counted with
the buffers in model_states.py).

Pipeline (Narayanan et al. 2021, 1F1B schedule): rank r holds activations of min(p - r, m)
in-flight micro-batches of its layers, i.e. the first about L layers' worth in total; the last
stage holds one micro-batch's output layer. GPipe (Huang et al. 2019) holds all m micro-batches on
every rank, outputs included (stage_in_flight; counted on real schedules by
tests/integration/test_pipeline_activations.py). Korthikanti's formula divides the logits by t (vocabulary-parallel loss, Sec. 4.3); scalelab's GPT
gathers the logits whole on every TP rank (lm_head ColwiseParallel, Replicate output) for its plain
cross entropy, so its formula keeps 4 s b V (measured: 262,144 bytes at h 64, s 128, b 2, V 256, t 2).
"""
from __future__ import annotations

from .flops import slowest_stage, stage_layers
from .spec import Layout, ModelSpec

RESIDUAL_BYTES = 4      # torch autocast keeps the residual stream and LayerNorm in fp32


def layer_activation_bytes(s: int, b: int, h: int, a: int, t: int = 1, *, e: int = 2,
                           ffn: int | None = None, sequence_parallel: bool = False,
                           checkpointing: str = "none") -> float:
    """Korthikanti et al.'s bytes of one transformer layer (math attention with dropout), per
    micro-batch, on one TP rank."""
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


def gpt_layer_activation_bytes(s: int, b: int, h: int, a: int, t: int = 1, *, e: int = 2,
                               ffn: int | None = None, sequence_parallel: bool = False,
                               checkpointing: str = "none", attention: str = "flash",
                               weights_16bit: bool = False) -> float:
    """Bytes one block of scalelab's GPT saves for backward (no dropout, or flash attention),
    per micro-batch, on one TP rank. Formula 2 of the module docstring. weights_16bit: the model
    itself is 16-bit (DeepSpeed's bf16/fp16 modes, bf16-true): no autocast, so the residual
    stream and LayerNorms are 16-bit too (r = e) and q, k, v share one LayerNorm output (c = 1)."""
    f, r = ffn or 4 * h, (e if weights_16bit else RESIDUAL_BYTES)
    if checkpointing == "full":
        return r * s * b * h / (t if sequence_parallel else 1)
    ln_out_copies = 3 if e < 4 and not weights_16bit else 1
    ln_in = s * b * h * 2 * r + 16 * s * b               # LayerNorm inputs + fp32 mean/rstd
    ln_out = s * b * h * (ln_out_copies + 1) * e         # the matmuls' inputs (LayerNorm outputs)
    split = s * b * h * 4 * e + 2 * e * f * s * b
    core = 4 * a * s * b if attention == "flash" else e * a * s * s * b
    if checkpointing == "selective":
        core = 0.0                                       # recomputed in backward
    if sequence_parallel:
        # torch's SequenceParallel / PrepareModuleInput: the LayerNorms run on s/t positions, but the
        # all-gathered LayerNorm output is what q/k/v and the MLP's up save: full size on every rank
        # (Megatron re-gathers it in backward instead; Korthikanti's 34/t assumes that).
        return ln_in / t + ln_out + (split + core) / t
    return ln_in + ln_out + (split + core) / t


def loss_backward_bytes(s: int, b: int, V: int) -> float:
    """The cross entropy's backward at the head, beside every saved activation: the backward of
    LitModule's F.cross_entropy(logits.float()) first makes the fp32 gradient of the log-softmax
    output (nll_loss_backward) and then that of its input (_log_softmax_backward_data) while the
    saved log-softmax (counted with the activations) is still alive: 2 x 4 s b V more, in fp32
    and under bf16 autocast alike. The step's allocator peak for any sizeable vocabulary (a byte
    vocabulary hides it); counted on the CPU allocator (tests/unit/test_plan_allocator_peak.py)."""
    return 8 * s * b * V


def _element_bytes(precision: str, weights_16bit: bool) -> tuple[int, bool, int]:
    """(e, weights_16bit, r): 16-bit (2) or fp32 (4) activations; whether the weights themselves
    are 16-bit (only under mixed precision); the residual stream's bytes (fp32 under autocast)."""
    e = 4 if precision == "32" else 2
    weights_16bit = weights_16bit and e == 2
    return e, weights_16bit, e if weights_16bit else RESIDUAL_BYTES


def _rank_layers(model: ModelSpec, layout: Layout) -> list[float]:
    """Layers per (virtual) stage each pipeline rank runs, as the run splits them: its stage's, or
    (interleaved) the mean of its v chunks'."""
    p = layout.pp
    v = max(layout.stages_per_rank, 1) if p > 1 else 1
    per_stage = stage_layers(model.n_layers, p * v, layout.split, model)
    return [sum(per_stage[k] for k in range(r, p * v, p)) / v for r in range(p)]


def uses_paper_formula(model: ModelSpec) -> bool:
    """Korthikanti's setting: s x s scores in memory and dropout masks to keep."""
    return model.attention == "math" and model.dropout > 0


def activation_bytes_per_device(model: ModelSpec, layout: Layout, precision: str,
                                checkpointing: str = "none", weights_16bit: bool = False,
                                loss_transient: bool = False) -> float:
    """The most any device holds: the largest of activation_bytes_per_rank."""
    return max(activation_bytes_per_rank(model, layout, precision, checkpointing, weights_16bit, loss_transient))


def activation_bytes_per_rank(model: ModelSpec, layout: Layout, precision: str,
                              checkpointing: str = "none", weights_16bit: bool = False,
                              loss_transient: bool = False) -> list[float]:
    """Each pipeline rank's activation bytes at its peak (one entry without a pipeline): what
    autograd saves, plus what a pipeline stage holds; with loss_transient (the planner's step peak,
    step_time.build_terms) also the cross entropy's backward at the head (loss_backward_bytes).
    weights_16bit: see gpt_layer_activation_bytes (DeepSpeed runs a mixed-precision job with
    16-bit weights and no autocast: the caller passes strategy family == deepspeed)."""
    e, weights_16bit, r = _element_bytes(precision, weights_16bit)
    b, t, p = layout.micro_batch, layout.tp, layout.pp
    if model.kind == "mlp":
        # Per linear layer: its input, the pre-activation and the activation output.
        return [3 * e * b * model.hidden * model.n_layers]
    s, h, V = model.seq_len, model.hidden, model.vocab
    sp = layout.sequence_parallel and t > 1
    if uses_paper_formula(model):
        per_layer = layer_activation_bytes(s, b, h, model.heads, t, e=e, ffn=model.ffn,
                                           sequence_parallel=sp, checkpointing=checkpointing)
        embedding = s * b * h                           # the embedding's dropout mask
        output = 4 * s * b * h / t + 4 * s * b * V / t
    else:
        per_layer = gpt_layer_activation_bytes(s, b, h, model.heads, t, e=e, ffn=model.ffn,
                                               sequence_parallel=sp, checkpointing=checkpointing,
                                               attention=model.attention, weights_16bit=weights_16bit)
        embedding = 8 * s * b                           # int64 token ids
        # SP: the final LayerNorm's input and stats are sequence shards; its output is gathered
        final_ln = (s * b * h * r + 8 * s * b) / (t if sp else 1) + s * b * h * e
        # logits gathered whole (no vocab-parallel loss)
        output = final_ln + 4 * s * b * V + 8 * s * b
    v = max(layout.stages_per_rank, 1) if p > 1 else 1
    layers = _rank_layers(model, layout)
    stage = pipeline_stage_bytes(model, layout, r, e, sp)
    # once, on the rank with the head, beside every micro-batch it holds
    # (Korthikanti's setting: Megatron's vocabulary-parallel loss, a shard of the logits per TP rank)
    stage[-1] += loss_backward_bytes(s, b, V) / (t if uses_paper_formula(model) else 1) if loss_transient else 0.0
    if v > 1:
        # interleaved 1F1B (torch's ScheduleInterleaved1F1B, Narayanan et al. 2021 Sec. 2.2.2): rank
        # r runs (v-1) m/R + 2 (p-1-r) warm-up forwards of its chunks (R = max(1, m // p) rounds),
        # then one more before its first backward; each chunk holds one virtual stage's layers.
        # Rank 0: a little more than 1F1B's p micro-batches of L/p layers.
        m = layout.micro_batches
        ranks = []
        for rank in range(p):
            chunks = stage_in_flight(layout, rank)
            bytes_r = per_layer * layers[rank] * chunks + (embedding * min(-(-chunks // v), m) if rank == 0 else 0.0)
            ranks.append(bytes_r + (output if rank == p - 1 else 0.0) + stage[rank])
        return ranks
    return [(per_layer * layers[rank] + (embedding if rank == 0 else 0.0) + (output if rank == p - 1 else 0.0))
            * stage_in_flight(layout, rank) + stage[rank] for rank in range(p)]


def recompute_peak_per_rank(model: ModelSpec, layout: Layout, precision: str, checkpointing: str,
                            weights_16bit: bool = False) -> list[float]:
    """Full recompute's own moment, per rank, gradients not included (the caller adds them): backward
    runs each block's forward again and keeps that block's activations for its backward, beside the
    stored block inputs, while the gradients have grown nearly whole; at the end of backward this,
    not the end of the forward, is the peak (the CPU allocator: tests/unit/test_plan_allocator_peak.py).
    Counted as every stored input, the token ids, what the pipeline stage holds and one block's
    activations without recompute: a pipeline stage's bound (its in-flight micro-batches keep
    their stored inputs). Without a pipeline, peak_memory._late_moment counts block by block
    (recompute_backward_bytes). 0 without full recompute."""
    p = layout.pp
    if checkpointing != "full" or model.kind == "mlp" or uses_paper_formula(model):
        return [0.0] * p
    e, r_b, sp, stored, block = _stored_and_block(model, layout, precision, weights_16bit)
    s, b = model.seq_len, layout.micro_batch
    held = pipeline_stage_bytes(model, layout, r_b, e, sp)     # outputs in flight and receive buffers
    return [(stored * layers + (8 * s * b if r == 0 else 0.0)) * stage_in_flight(layout, r) + held[r] + block
            for r, layers in enumerate(_rank_layers(model, layout))]


def _stored_and_block(model: ModelSpec, layout: Layout, precision: str, weights_16bit: bool):
    """(e, r, sequence parallel, one block's stored input under full recompute, the block's
    activations when recomputed) per rank."""
    e, weights_16bit, r_b = _element_bytes(precision, weights_16bit)
    s, b, h, t = model.seq_len, layout.micro_batch, model.hidden, layout.tp
    sp = layout.sequence_parallel and t > 1
    kw = dict(e=e, ffn=model.ffn, sequence_parallel=sp, attention=model.attention, weights_16bit=weights_16bit)
    return (e, r_b, sp, gpt_layer_activation_bytes(s, b, h, model.heads, t, checkpointing="full", **kw),
            gpt_layer_activation_bytes(s, b, h, model.heads, t, checkpointing="none", **kw))


def recompute_backward_bytes(model: ModelSpec, layout: Layout, precision: str,
                             weights_16bit: bool = False) -> tuple[float, float]:
    """Full recompute without a pipeline, per rank, gradients aside: (what one block's backward
    holds: the token ids, its stored input, its recomputed activations and, as its backward
    starts, the MLP hidden's gradient (16-bit under autocast, beside the incoming gradient's
    16-bit cast); each other block's stored input, alive until that block's backward). The
    caller adds the gradients made so far and max(one block's gradients, one stored input) per
    other block: the CPU allocator's peaks within 2 % over 10 shapes (benchmarks/gpu_h200.md)."""
    e, r_b, sp, stored, block = _stored_and_block(model, layout, precision, weights_16bit)
    s, b, h, t = model.seq_len, layout.micro_batch, model.hidden, layout.tp
    hidden_grad = s * b * model.ffn * e / t + (s * b * h * e / (t if sp else 1) if r_b != e else 0.0)
    return 8 * s * b + stored + block + hidden_grad, stored


def pipeline_stage_bytes(model: ModelSpec, layout: Layout, stream: int, e: int, sp: bool,
                         resident_only: bool = False) -> list[float]:
    """What torch's PipelineStage itself holds on each rank, besides the saved tensors (counted by
    tests/integration/pipeline_acts_probe.py): each in-flight micro-batch's output until its
    backward (fwd_cache: the residual stream, `stream` bytes per element, fp32 under autocast; on
    the last stage the logits, in the compute dtype, whole on every TP rank), and the receive
    buffers it allocates once for all m micro-batches (resident_only: these alone): gradients on
    every stage but the last, activations on every stage but the first (an in-flight one is the
    first LayerNorm's saved input, so only the m - in-flight idle ones are added). Interleaved
    1F1B: per virtual stage, its in-flight chunks spread evenly over the rank's v chunks. Not a
    pipeline schedule: nothing."""
    p, m, v = layout.pp, layout.micro_batches, max(layout.stages_per_rank, 1)
    if layout.schedule == "none":
        return [0.0] * p
    unit = model.seq_len * layout.micro_batch * model.hidden * stream / (layout.tp if sp else 1)
    logits = model.seq_len * layout.micro_batch * model.vocab * e
    out = []
    for rank in range(p):
        chunks = stage_in_flight(layout, rank)
        virtual = [rank + i * p for i in range(v)]             # this rank's (virtual) stages
        per_chunk = chunks / v
        last = p * v - 1
        outputs = 0.0 if resident_only else sum(per_chunk * (logits if k == last else unit) for k in virtual)
        grad_buffers = sum(m * unit for k in virtual if k < last)
        idle_inputs = sum(max(m - per_chunk, 0.0) * unit for k in virtual if k > 0)
        out.append(outputs + grad_buffers + idle_inputs)
    return out


def pipeline_receive_bytes(model: ModelSpec, layout: Layout, precision: str, weights_16bit: bool = False) -> list[float]:
    """Each rank's receive buffers (pipeline_stage_bytes' resident part): allocated once, they
    stay when backward frees micro-batches (model_states.pipeline_acts_alive_at_grads)."""
    if model.kind == "mlp":
        return [0.0] * layout.pp
    e, _, stream = _element_bytes(precision, weights_16bit)
    return pipeline_stage_bytes(model, layout, stream, e, layout.sequence_parallel and layout.tp > 1,
                                resident_only=True)


def stage_in_flight(layout: Layout, rank: int) -> int:
    """Micro-batches (interleaved: chunk micro-batches) whose activations pipeline rank `rank`
    holds at its peak. torch's Schedule1F1B runs min(m, p - r) warm-up forwards before rank r's
    first backward (the last stage: forward, then at once its backward); ScheduleGPipe runs every
    forward before any backward, so every rank holds all m, the last one m outputs too (also at
    pp 1, where the pipeline and nd strategies run a one-stage schedule);
    ScheduleInterleaved1F1B: (v - 1) m / R + 2 (p - 1 - r) warm-up chunk forwards (R = max(1, m // p)
    rounds) and one more before the first backward. Not a pipeline (gradient accumulation): one."""
    p, m, v = layout.pp, layout.micro_batches, layout.stages_per_rank
    if v > 1:
        per_round = m // max(1, m // p)
        return min((v - 1) * per_round + 2 * (p - 1 - rank) + 1, m * v)
    if layout.schedule == "gpipe":
        return m
    return max(min(p - rank, m), 1)


def activation_traffic_bytes(model: ModelSpec, layout: Layout, precision: str,
                             checkpointing: str = "none") -> float:
    """Activation bytes one device writes in the forward passes of one optimizer step (all its
    micro-batches, its own layers and TP share, the output layer on the last stage).

    Elementwise work (LayerNorm, GELU, softmax, residual adds, their gradients) is memory-bound:
    its time is this traffic over memory bandwidth, not FLOPs over peak (the roofline model,
    Williams et al. 2009, CACM 52(4)). It is what makes small-width models slower than their
    FLOPs say. Recomputation writes the recomputed layers' activations a second time.
    Deliberately Korthikanti's formula whatever model.attention and model.dropout say: the
    profiles' activation_bandwidth was fitted against these bytes, so step times stay put. On a GPU
    it is also what the measurements say (H200, benchmarks/gpu_h200.md, single, bf16-mixed): with
    compute_efficiency fitted on the 86M GPT (34.5 ms), these bytes predict the 1.2B GPT at 144.2 ms
    against 137.5 measured (1.05x); flash's bytes alone (no s x s scores: 10.1 of the 86M step's
    14.4 ms of traffic) refit the efficiency to 0.37 and predict 194.7 ms (1.42x). The score bytes
    stand in for the attention kernel's own cost, which grows with heads at a fixed width (a
    smaller head dimension) as they do."""
    e = 4 if precision == "32" else 2
    b, t = layout.micro_batch, layout.tp
    if model.kind == "mlp":
        per_micro = 3 * e * b * model.hidden * model.n_layers
    else:
        s, h = model.seq_len, model.hidden
        sp = layout.sequence_parallel and t > 1
        per_layer = layer_activation_bytes(s, b, h, model.heads, t, e=e, ffn=model.ffn,
                                           sequence_parallel=sp)
        layers, has_head = slowest_stage(model, layout.pp, getattr(layout, "split", "uniform"))
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

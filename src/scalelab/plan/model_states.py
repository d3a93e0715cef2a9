"""Model-state memory per device: parameters, gradients, optimizer state.

Source: Rajbhandari et al. 2020, "ZeRO: Memory Optimizations Toward Training Trillion Parameter
Models" (arXiv:1910.02054), Sec. 3.1 and Fig. 1. With Psi parameters, N_d data-parallel ranks and
mixed-precision Adam, each rank holds 2 Psi (16-bit params) + 2 Psi (16-bit grads) + K Psi
(optimizer: fp32 master params, momentum, variance, K = 12):

    baseline DP  (2 + 2 + K) Psi                 ZeRO-1 (P_os)     2 Psi + 2 Psi + K Psi / N_d
    ZeRO-2 (P_os+g)  2 Psi + (2 + K) Psi / N_d   ZeRO-3 (P_os+g+p) (2 + 2 + K) Psi / N_d

How each strategy family stores the states (bytes per parameter: params, grads, optimizer):
- torch (single/ddp/tp/pipeline) and fsdp under Lightning: mixed precision is autocast, weights
  and grads stay fp32 -> 4, 4, 8 (Adam m, v) or 4 (SGD momentum), whatever the precision. FSDP
  keeps fp32 shards and gathers 16-bit copies (Lightning's FSDPPrecision param_dtype).
  bf16-true (not DeepSpeed): the module itself is bf16, so are its gradients and the optimizer's
  states (created like the parameters) -> 2, 2, 4 (Adam) or 2 (SGD momentum); no autocast copies.
- deepspeed (zero*): mixed precision "as DeepSpeed does it" -> 2, 2, K with K = 12 (Adam) or 8
  (SGD: master + momentum). In fp32, ZeRO-1/2 still clone the fp32 partition for the optimizer
  (stage_1_and_2.py, `single_partition_of_fp32_groups`), so K = 12 there too, and so does ZeRO-3
  (its reuse branch never fires in 0.19.8: see bytes_per_param).
Where DeepSpeed 0.19.8 departs from the paper (each measured by StepMetrics on CPU runs, see
strategies/deepspeed.py `state_bytes`, and checked in tests/unit/test_plan_model_states_ds.py):
- ZeRO-1 with overlap_comm or contiguous_gradients on (Lightning's and conf/strategy/zero1.yaml's
  defaults) reduces gradients in backward hooks like ZeRO-2 and keeps only the
  partition when every micro-batch is an accumulation boundary (no accumulation): grads Psi / N
  then, full grads otherwise.
- ZeRO-3 keeps every parameter tensor of at most stage3_param_persistence_threshold (1e5)
  elements whole on every rank, besides its partition: LayerNorms and biases on big models, every
  tensor on our tiny CPU models.
- ZeRO-3 at 2+ ranks does not release what it gathered after each layer's forward, as the
  paper's 3 Psi communication assumes: with DeepSpeed's defaults (stage3_max_reuse_distance 1e9,
  stage3_prefetch_bucket_size 5e7, stage3_max_live_parameters 1e9) it keeps the whole model
  gathered until the backward up to ~1e9 parameters, and 1.0e9-1.5e9 of them above
  (plan/zero3_trace.py, counted on real engines). Those are buffers at the activations' peak; the
  backward gathers only the rest again. At world size 1 it gathers nothing (each partition is the
  whole tensor), unless the partitions are offloaded (copied to the device by the same rules).
- ZeRO-3 with an offloaded optimizer reduces gradients into a host partition buffer in the
  gradient accumulation dtype (the model's: fp32 in fp32, 16-bit under bf16-mixed) and steps on
  an fp32 copy: 8 Psi / N on the host in fp32, 6 Psi / N under bf16-mixed.
"""
from __future__ import annotations

import functools
from dataclasses import dataclass, asdict

from .activations import stage_in_flight
from .flops import stage_layers
from .spec import AUTOCAST, Layout, ModelSpec, Strategy
from .zero3_trace import gpt_units, kept_gathered_elements



def ds_contiguous_gradients(strategy: Strategy) -> bool:
    """contiguous_gradients as DeepSpeed applies it: ZeRO-1/2 turn it on whenever the optimizer is
    offloaded (stage_1_and_2.py: "CPU-Offload requires contiguous gradients")."""
    return strategy.contiguous_gradients or (strategy.offload_optimizer and strategy.zero_stage in (1, 2))


def zero_offload_staging_bytes(model: ModelSpec, strategy: Strategy, g_b: int) -> float:
    """ZeRO-1/2 with an offloaded optimizer stage each gradient through a buffer the size of the
    model's largest parameter tensor, one on the device and one (pinned) in host memory
    (stage_1_and_2.py temp_grad_buffer_for_{gpu,cpu}_offload): the bytes of one of them."""
    if not (strategy.offload_optimizer and strategy.zero_stage in (1, 2)):
        return 0.0
    return largest_tensor(model) * g_b


def largest_tensor(model: ModelSpec) -> int:
    """Elements of the model's largest parameter tensor (of its weight matrices)."""
    return max(e for e, _ in model.weight_matrices())


def zero_bucket_bytes(strategy: Strategy, psi: float, g_b: int) -> tuple[float, float]:
    """(allocated, written) bytes of DeepSpeed 0.19.8's gradient reduce buckets on one rank, at
    any world size, with B = strategy.reduce_bucket_elements (the config's reduce_bucket_size)
    in the gradients' 16-bit or fp32 dtype (g_b bytes). Counted on real engines in
    tests/integration/test_plan_ds_buffers.py:
    - ZeRO-1/2 with contiguous_gradients allocate B elements at the start of every backward
      (stage_1_and_2.py setup_buckets), twice with overlap_comm (double buffering), and free
      them after the step; without it they flatten each bucket's gradients into a new tensor
      to reduce it (allreduce_bucket): up to min(Psi, B) elements.
    - ZeRO-3 with contiguous_gradients allocates one buffer of B elements at init and keeps it.
    - ZeRO-1/2 with an offloaded optimizer always use contiguous buckets (ds_contiguous_gradients).
    A device allocator counts all of it; on a CPU only the pages written reach the RSS (the
    gradients copied in: at most min(Psi, B) elements)."""
    bucket = strategy.reduce_bucket_elements
    written = min(psi, bucket) * g_b
    if not ds_contiguous_gradients(strategy):
        return (written, written) if strategy.zero_stage in (1, 2) else (0.0, 0.0)
    copies = 2 if strategy.overlap_comm and strategy.zero_stage in (1, 2) else 1
    return copies * bucket * g_b, written


def zero_paper_bytes(psi: float, n_d: int, stage: int, k: int = 12) -> float:
    """Per-rank model-state bytes from the ZeRO paper (mixed precision; stage 0 = plain DP)."""
    if stage == 0:
        return (2 + 2 + k) * psi
    if stage == 1:
        return (2 + 2) * psi + k * psi / n_d
    if stage == 2:
        return 2 * psi + (2 + k) * psi / n_d
    if stage == 3:
        return (2 + 2 + k) * psi / n_d
    raise ValueError(f"ZeRO stage must be 0..3, got {stage}")


def bytes_per_param(strategy: Strategy, precision: str, optimizer: str) -> tuple[int, int, int]:
    """(param, grad, optimizer-state) bytes per parameter for this strategy family."""
    # Adam m + v, SGD momentum (fp32); SGD with momentum 0 allocates no buffer (0 measured)
    moments = {"adam": 8, "sgd": 4}.get(optimizer, 0)
    if strategy.family == "deepspeed":
        if precision == "32":
            # DeepSpeed 0.19.8 keeps an fp32 master copy of each partition at every stage, even in
            # fp32 (the stage-3 reuse path compares a torch.device to a string and never fires):
            # measured in tests/integration/test_deepspeed.py (optimizer = 0.75 x DDP at 2 ranks).
            master = 4
            return 4, 4, moments + master
        return 2, 2, moments + 4                       # K = 12 for Adam (ZeRO paper)
    if precision == "bf16-true":
        return 2, 2, moments // 2
    return 4, 4, moments


@dataclass
class ModelStates:
    params_bytes: float          # resident on the device at the step's peak
    grads_bytes: float
    optimizer_bytes: float
    buffers_bytes: float         # transient: gathered layers (FSDP/ZeRO-3), reduce buckets
    offloaded_bytes: float       # kept in host memory instead (ZeRO-Offload)
    params_per_device: float     # parameters this device holds a shard of (Psi / (tp pp))
    updated_params_per_device: float  # parameters whose optimizer step this device runs
    unwritten_buffer_bytes: float = 0.0  # of buffers_bytes: allocated, never written (not in a CPU's RSS)
    host_buffer_bytes: float = 0.0       # offload's pinned staging buffers in host memory (not model state)
    grads_at_peak: bool = True           # False: freed before the forward (grads_at_peak())
    # of the activations, the fraction still alive when the whole gradient is first allocated in
    # backward (0: it grows as they are freed); ZeRO-1/2: zero_grads_allocated_early()
    acts_alive_at_grads: float = 0.0
    # of buffers_bytes: autocast's 16-bit weight copies gone before backward (its cast cache is
    # dropped when the forward's autocast exits), for full recompute's late moment (peak_memory)
    copies_gone_in_backward: float = 0.0
    # ... and of those, the ones already gone at the head's backward (the cross entropy's
    # transient, activations.loss_backward_bytes): the blocks' (their checkpointed forwards saved
    # no copy); only the head's own copy is still saved by its matmul
    copies_gone_at_head: float = 0.0
    # of buffers_bytes: all of autocast's weight copies, each freed with its layer's backward, so
    # none is left when the gradient is whole (gradients freed before the forward: the CPU
    # allocator's peak is the gradients alone on weight-heavy shapes; peak_memory)
    copies_bytes: float = 0.0
    new_grad_bytes: float = 0.0         # a fresh gradient beside an accumulated one (the head's)
    # a pipeline's gradients freed before its schedule (dp 1): at each rank's peak or not by its
    # schedule; at dp > 1 kept (DDP's bucket views) and at every rank's peak
    # (pipeline_acts_alive_at_grads; peak_memory.peak_states_and_activations)
    grads_per_rank: bool = False
    # FSDP2 under a pipeline schedule: gathered bytes beyond buffers_bytes held right after a
    # backward, with one micro-batch fewer of activations alive (fsdp_pipeline_buffers)
    gathered_after_backward: float = 0.0

    @property
    def total_bytes(self) -> float:
        return self.params_bytes + self.grads_bytes + self.optimizer_bytes

    def resident_buffer_bytes(self, cpu: bool) -> float:
        """buffers_bytes as the memory figure sees them: all of them on a device allocator, the
        written part only in a CPU rank's RSS."""
        return self.buffers_bytes - (self.unwritten_buffer_bytes if cpu else 0.0)

    def as_dict(self) -> dict:
        d = asdict(self)
        d["model_states_bytes"] = self.total_bytes
        return d


def stage_params(model: ModelSpec, pp: int, split: str = "uniform") -> list[tuple[float, float]]:
    """(parameters, of which replicated under tensor parallelism) of each pipeline stage: its
    blocks (split as flops.stage_layers does); the first stage also holds the token and position
    embeddings, the last the final LayerNorm and the output head (scalelab's untied head; with a
    tied one Megatron keeps a copy of the embedding there: the same V x h either way). TP splits
    the weight matrices and the vocabulary; LayerNorms (4h a block, 2h at the end) and the
    position embedding stay whole on every TP rank (strategies/tensor_parallel.py)."""
    h, V, s = model.hidden, model.vocab, model.seq_len
    head = V * h if pp > 1 or not tied(model) else 0.0    # one model with a tied head holds it once
    out = [(float(n * model.layer_params), float(n * 4 * h)) for n in stage_layers(model.n_layers, pp, split, model)]
    out[0] = (out[0][0] + V * h + s * h, out[0][1] + s * h)
    out[-1] = (out[-1][0] + head + 2 * h, out[-1][1] + 2 * h)
    return out


def tied(model: ModelSpec) -> bool:
    """No room in n_params for an output head apart from the token embedding."""
    return len(model.weight_matrices()) == 4


def local_params(model: ModelSpec, layout: Layout) -> float:
    """Parameters one device holds before data-parallel sharding: of the largest pipeline stage
    (stage_params), the split part / tp plus the replicated part; scaled to the model's n_params
    (the shape's formula and a model's real count differ by biases and a tied head)."""
    if model.kind != "gpt":
        return model.n_params / layout.tp
    stages = stage_params(model, layout.pp, getattr(layout, "split", "uniform"))
    copy = model.vocab * model.hidden if layout.pp > 1 and tied(model) else 0   # Megatron's copy: no parameter
    whole = sum(c for c, _ in stages) - copy
    largest = max((c - r) / layout.tp + r for c, r in stages)
    return model.n_params * largest / whole


def persistent_params(model: ModelSpec, strategy: Strategy, psi: float) -> float:
    """Of a device's psi parameters, those ZeRO-3 keeps whole on every rank and never gathers:
    the tensors below stage3_param_persistence_threshold (module docstring)."""
    if not (strategy.shard_params and strategy.param_persistence_elements):
        return 0.0
    return model.small_params(strategy.param_persistence_elements) * psi / model.n_params


def grads_at_peak(strategy: Strategy, layout: Layout) -> bool:
    """Whether the gradients live through the forward, where the activations peak. ScaleLab's
    torch strategies free them right after the optimizer step (models.lit.LitModule), as a
    hand-written loop does, and DeepSpeed ZeRO-1/2 allocate their gradient partition and reduce
    buckets in backward and free them in the step (stage_1_and_2.py: grads_in_partition,
    averaged_gradients, _release_ipg_buffers). The next forward then runs without them and
    backward creates them as it frees the activations, so the step's peak holds the larger of
    the two, not their sum. They live on under gradient accumulation (micro-batch 2's forward runs
    beside micro-batch 1's gradients), in a pipeline's schedule (a stage's gradients from the first
    micro-batch's backward on at dp 1; at dp > 1 from the step's start, as its DDP's bucket views:
    pipeline_acts_alive_at_grads), in DDP's persistent buckets, and in ZeRO-3's gradient partition
    buffer (allocated once at init: stage3.py grad_partitions_flat_buffer)."""
    if strategy.family == "fsdp" and strategy.pipeline and layout.dp > 1:
        return False   # the sharded .grad is set at the step's end (whole ones: fsdp_pipeline_buffers)
    return (strategy.zero_stage == 3 or strategy.pipeline or layout.micro_batches > 1
            or strategy.grad_buckets)


def pipeline_acts_alive_at_grads(layout: Layout, rank: int) -> float | None:
    """A pipeline rank whose gradients are freed before the step (Pipeline.training_step:
    zero_grad(set_to_none=True) before the schedule runs at dp 1; also nd at dp 1): None when its
    gradients live through its activations' peak, else the fraction of that peak's activations
    alive when its first backward has made the whole gradient. 1F1B runs forwards after a rank's
    first backward when m exceeds its warm-up depth d (then both are at the peak); at m = d (rank 0
    at m = p) and under GPipe (d = m: every forward before any backward) it runs none: the peak is
    max(d a, grads + (d - 1) a). Interleaved: both (the safe side). Counted on real schedules:
    tests/integration/pipeline_acts_probe.py.
    At dp > 1 (the `pipeline` strategy; nd's FSDP2 stages there are not planned through this: their
    gradients are not at the peak, grads_at_peak) the stage is DDP with gradient_as_bucket_view:
    the gradients are views of its buckets, zeroed in place before the step, not freed
    (Pipeline._data_parallel), so they are alive from the step's start beside every activation,
    one copy (the buckets are the gradients): None. tests/integration/test_pipeline_dp_memory.py."""
    if layout.stages_per_rank > 1 or layout.dp > 1:
        return None
    d = stage_in_flight(layout, rank)
    if layout.schedule != "gpipe" and layout.micro_batches > d:
        return None
    return (d - 1) / d


def zero_grads_allocated_early(strategy: Strategy, psi: float, largest: float) -> float:
    """ZeRO-1/2 with contiguous_gradients allocate a rank's whole gradient partition when the first
    bucket holding its gradients is reduced (stage_1_and_2.py copy_grads_in_partition:
    grads_in_partition). With psi gradient elements above reduce_bucket_size B, the first bucket
    is reduced when the next gradient would overflow it, after more than B - largest elements
    (the largest tensor): early in backward, beside up to 1 - (B - largest) / psi of the
    activations (on the rank that owns the last layers). At or below B: at the end of backward.
    Counted on real engines: tests/integration/ds_buffers_probe.py (zero2_bucket_5e3)."""
    if strategy.zero_stage not in (1, 2) or not ds_contiguous_gradients(strategy) \
            or psi <= strategy.reduce_bucket_elements:
        return 0.0
    return min(1.0, 1.0 - max(strategy.reduce_bucket_elements - largest, 0.0) / psi)


def fsdp_pipeline_buffers(strategy: Strategy, psi: float, largest: float, gathered_b: int,
                          g_b: int, chunks: int = 1) -> tuple[float, float]:
    """(buffers, gathered_after_backward) of an FSDP2 stage run by torch.distributed.pipelining
    (nd; also at pp 1, a one-stage schedule). Torch's PipelineStage sets
    set_reshard_after_backward(False) and set_requires_gradient_sync(False) for every micro-batch
    and runs FSDP's post-backward once at the step's end (perform_reduce_grad): the stage's
    gradients accumulate whole, unsharded, in the reduce dtype (fp32), from the first backward to
    the step's end, and each Block stays gathered after a backward until the next forward
    reshards it (reshard_after_forward). So the buffers are the whole gradients plus one unit in use
    and one prefetched; right after a backward, with one micro-batch fewer of activations alive,
    the whole stage (interleaved: the chunk of `chunks` just run) is gathered: the rest of it is
    `gathered_after_backward` (peak_memory.peak_states_and_activations takes the larger moment).
    Without resharding after forward the stage stays gathered throughout.
    tests/integration/test_nd_fsdp_pipeline.py records this on real ranks."""
    if not strategy.reshard_after_forward:
        return psi * gathered_b + psi * g_b, 0.0
    units = min(2 * largest, psi) * gathered_b
    return psi * g_b + units, max(0.0, psi / chunks * gathered_b - units)


def autocast_copied_params(model: ModelSpec, psi: float) -> float:
    """Parameters autocast casts to 16 bits on a rank holding psi: the Linear layers' weights
    (blocks and an untied head); embeddings and LayerNorms run in fp32 (the CPU allocator:
    tests/unit/test_plan_allocator_peak.py)."""
    mats = sum(e * c for e, c in model.weight_matrices())
    if model.kind == "gpt":
        mats -= (model.vocab + model.seq_len) * model.hidden          # token and position embeddings
    return min(psi, max(mats, 0) * psi / model.n_params)


def fsdp_root_params(model: ModelSpec, psi: float) -> float:
    """Parameters of FSDP2's root unit on a rank holding psi: what is not in a Block (embeddings,
    final norm, head); the whole model for a model without Blocks (kind mlp)."""
    if model.kind == "mlp":
        return psi
    return max(0.0, model.n_params - model.n_layers * model.layer_params) * psi / model.n_params


def zero3_kept_gathered(model: ModelSpec, strategy: Strategy, layout: Layout) -> float:
    """Elements of gathered parameters DeepSpeed ZeRO-3 holds at the end of the forward, per
    rank (plan/zero3_trace.py); 0 for any other strategy and at world size 1 with the partitions
    on the device, where ZeRO-3 gathers nothing (each partition is the whole tensor). With
    offload_params the partitions live on the host and are copied to the device under the same
    coordinator rules at any world size."""
    if strategy.zero_stage != 3 or (layout.dp < 2 and not strategy.offload_params):
        return 0.0   # (offloaded partitions are copied to the device at any world size)
    psi = local_params(model, layout)
    # capped at what is gathered at all: a shape's own count can exceed a model's n_params
    return min(psi - persistent_params(model, strategy, psi),
               _kept(model, strategy.zero3_fetch_unit, layout.tp, strategy.param_persistence_elements,
                     strategy.zero3_reuse_distance, strategy.zero3_prefetch_elements, strategy.zero3_max_live))


@functools.lru_cache(maxsize=256)
def _kept(model, unit, tp, persistence, reuse, prefetch, max_live) -> int:
    return kept_gathered_elements(gpt_units(model, unit, tp), persistence, reuse, prefetch, max_live)


def model_states(model: ModelSpec, strategy: Strategy, layout: Layout, precision: str,
                 optimizer: str) -> ModelStates:
    psi = local_params(model, layout)
    p_b, g_b, o_b = bytes_per_param(strategy, precision, optimizer)
    n = layout.dp_shard                      # the shard group (HSDP: FSDP2 shards inside a replica)
    params = psi * p_b / (n if strategy.shard_params else 1)
    # DeepSpeed ZeRO-1 keeps the gradient partition only without accumulation (module docstring)
    ds_zero1_partitioned = (strategy.zero_stage == 1 and layout.micro_batches == 1
                            and (strategy.overlap_comm or ds_contiguous_gradients(strategy)))
    grads = psi * g_b / (n if strategy.shard_grads or ds_zero1_partitioned else 1)
    opt = psi * o_b / (n if strategy.shard_optimizer else 1)
    updated = psi / (n if strategy.shard_optimizer else 1)
    # ZeRO-3 persistence: small tensors stay whole on every rank on top of their partition.
    persistent_elems = persistent_params(model, strategy, psi) if n > 1 else 0.0
    persistent = persistent_elems * p_b
    offloaded = 0.0
    if strategy.offload_optimizer:
        # ZeRO-Offload (Ren et al. 2021): fp32 master + moments and the fp32 gradient partition
        # live on the host; the device keeps the 16-bit params (stage 2 estimate: 2 Psi).
        offloaded += opt + psi * 4 / n
        if strategy.zero_stage == 3:
            # + the host gradient partition buffer, in the gradient accumulation dtype (DeepSpeed's
            # default: the model's, 16-bit under bf16-mixed; stage3.py grad_partitions_flat_buffer)
            offloaded += psi * g_b / n
        opt, grads = 0.0, 0.0
    if strategy.offload_params:
        offloaded += params
        params = 0.0
    params += persistent

    gathered_b = 2 if precision != "32" else 4        # dtype of gathered copies / comm
    # (ZeRO-3 gathers only what does not persist: nothing at all on a tiny model)
    largest = min(model.largest_layer_params / layout.tp, psi - persistent_elems)
    buffers, after_backward, copies, copies_gone, gone_at_head = 0.0, 0.0, 0.0, 0.0, 0.0
    if strategy.family == "torch" and not strategy.shard_params and precision in AUTOCAST:
        # Autocast's 16-bit copies of the fp32 weights: autograd keeps them for backward, so they
        # live from forward to the end of backward (2 bytes per parameter; measured on an H200:
        # the 1.2B GPT's single run holds 2.25 GiB more than its states and activations). Also
        # under full recompute: autocast's cast cache keeps every copy until its context exits,
        # after the forward, so that backward's recompute holds only its block's again; a
        # pipeline's schedule runs inside training_step's autocast, which spans its backward
        copies = 2 * autocast_copied_params(model, psi)
        buffers += copies
        if not strategy.pipeline and model.kind == "gpt":
            block = 2 * (4 * model.hidden ** 2 + 2 * model.hidden * model.ffn) / layout.tp
            copies_gone = copies - min(copies, block)
            gone_at_head = min(copies, model.n_layers * block)
    kept = zero3_kept_gathered(model, strategy, layout)
    if kept:
        # DeepSpeed ZeRO-3 at 2+ ranks: the gathered tensors its coordinator keeps from the forward
        # to the backward (plan/zero3_trace.py; the whole model up to ~1e9 parameters with
        # DeepSpeed's defaults), at least one unit in use and one prefetched, plus one unit's
        # unsharded gradient before its reduce-scatter
        buffers = max(kept, 2 * largest) * gathered_b + largest * g_b
    elif strategy.zero_stage == 3 and n == 1 and not strategy.offload_params:
        # ZeRO-3 at world size 1 gathers nothing: each partition is the whole tensor
        # (partition_parameters.all_gather_coalesced -> _no_gather_coalesced); a unit's gradient
        # before it is reduced into the partition remains
        buffers = largest * g_b
    elif strategy.shard_params:
        # (also at world size 1: FSDP2 still gathers each unit into its own buffer.) FSDP2's units
        # are the Blocks and the root, which holds the rest: both embeddings and an untied head,
        # or all of a model without Blocks (strategies/fsdp.py)
        if strategy.family == "fsdp":
            largest = max(largest, fsdp_root_params(model, psi))
        if strategy.family == "fsdp" and strategy.pipeline and layout.dp > 1:
            buffers, after_backward = fsdp_pipeline_buffers(strategy, psi, largest, gathered_b, g_b,
                                                            layout.stages_per_rank)
        elif strategy.reshard_after_forward:
            # One unit in use + one prefetched, plus that unit's unsharded gradient before its
            # reduce-scatter (DeepSpeed's own ZeRO-3 estimate uses 4 bytes x largest layer).
            buffers = largest * (2 * gathered_b + g_b)
        else:
            # SHARD_GRAD_OP keeps the whole gathered model from forward to the end of backward.
            buffers = psi * gathered_b + largest * g_b
    if strategy.family == "deepspeed" and strategy.zero_stage in (1, 2, 3):
        allocated, written = zero_bucket_bytes(strategy, psi, g_b)
        staging = zero_offload_staging_bytes(model, strategy, g_b)         # its device copy (zeroed: written)
        return ModelStates(params, grads, opt, buffers + allocated + staging, offloaded, psi, updated,
                           allocated - written, host_buffer_bytes=staging,   # and its pinned host copy
                           grads_at_peak=grads_at_peak(strategy, layout),
                           acts_alive_at_grads=zero_grads_allocated_early(
                               strategy, psi, largest_tensor(model) / layout.tp))
    return ModelStates(params, grads, opt, buffers, offloaded, psi, updated,
                       grads_at_peak=grads_at_peak(strategy, layout), gathered_after_backward=after_backward,
                       grads_per_rank=strategy.pipeline, copies_gone_in_backward=copies_gone,
                       copies_gone_at_head=gone_at_head, copies_bytes=0.0 if strategy.pipeline else copies,
                       new_grad_bytes=min(largest_tensor(model) / layout.tp, psi) * g_b
                       if strategy.family == "torch" and layout.micro_batches > 1 else 0.0)

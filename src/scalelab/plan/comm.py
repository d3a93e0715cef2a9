"""Communication per training step: which collectives each strategy issues, their sizes and cost.

Cost model: the ring alpha-beta model (Patarasuk & Yuan 2009; Thakur et al. 2005) written with the
bus-bandwidth factors of nccl-tests (github.com/NVIDIA/nccl-tests, doc/PERFORMANCE.md). For a
buffer of S bytes over n ranks with bus bandwidth B and per-hop latency alpha:

    all-reduce       t = 2 (n-1) alpha + S * 2 (n-1)/n / B   (reduce-scatter then all-gather)
    reduce-scatter   t =   (n-1) alpha + S *   (n-1)/n / B   (S = the full, unsharded buffer)
    all-gather       t =   (n-1) alpha + S *   (n-1)/n / B
    send/recv (p2p)  t =         alpha + S / B

S * factor is also what each rank sends, so it is the "bytes per step per device" we report.
nccl-tests' busbw is exactly S * factor / t, so a profile's bandwidth is a measured busbw.

Volumes per step (Psi = parameters of the device's tp/pp chunk, g/p = comm bytes per gradient /
parameter element):
- DDP: all-reduce Psi g once per step (no_sync while accumulating), in 25 MiB buckets (the first
  1 MiB), overlapped with backward (Li et al. 2020, "PyTorch Distributed", VLDB); the pipeline's
  DDP stages too (reduced in the last micro-batch's backward). tp at dp > 1: FSDP2's replicate per
  Block and the root, one all-reduce per unit in its post-backward, once per step (no sync while
  accumulating: strategies/tensor_parallel.py). Variants: a
  bf16/fp16 comm hook halves g; PowerSGD (Vogels et al. 2019) sends r (n + m) per n x m matrix;
  post-local SGD (Lin et al. 2020) sends no gradients, only Psi x 4 every `period` steps.
- ZeRO-1/2 (Rajbhandari et al. 2020, Sec. 7): reduce-scatter Psi g + all-gather Psi p = 2 Psi, same
  as DP. Stage 1 reduces at the accumulation boundary, stage 2 in every backward (overlap_comm);
  without accumulation every backward is a boundary and DeepSpeed's stage 1 reduces bucket-wise in
  backward hooks too (overlappable, like stage 2).
- ZeRO-3 / FSDP FULL_SHARD: all-gather forward + all-gather backward + reduce-scatter = 3 Psi, per
  layer unit and per micro-batch, prefetched (overlappable). FSDP SHARD_GRAD_OP skips the second
  all-gather (2 Psi). ZeRO-3 does not gather the tensors it keeps whole (at most
  stage3_param_persistence_threshold elements): small ones, or all of a tiny model's. What is
  gathered again in the backward is less than Psi in practice: FSDP2 does not reshard its root
  (embeddings, final norm, head) after the forward, and DeepSpeed's ZeRO-3 keeps what it will
  reuse soon (model_states.zero3_kept_gathered: the whole model up to ~1e9 parameters).
- Tensor parallel as scalelab's code runs it (strategies/tensor_parallel.py; Megatron-LM, Shoeybi
  et al. 2019, Sec. 3, with q, k, v and the MLP up as four separate column-parallel Linears): per
  Block and micro-batch 2 all-reduces of b s h forward (out_proj, down) and 4 backward (the input
  gradients of q, k, v, up: not Megatron's 2, which fuses qkv); + 1 all-reduce of the vocabulary-
  parallel embedding (first stage), + on the last stage 1 all-gather of the b s V logits (lm_head
  ColwiseParallel(output_layouts=Replicate())) and 1 backward all-reduce of its input gradient.
  With sequence parallelism (Korthikanti et al. 2022) every Block all-gathers its attention and
  MLP inputs and reduce-scatters the row-parallel outputs, and backward the reverse (4 all-gathers
  + 4 reduce-scatters of b s h), lm_head gathers its input too, the first Block's backward
  all-gathers the embedding gradient, and FSDP2/replicate (fsdp_tp, nd at dp > 1, tp at dp > 1)
  all-reduce the sequence-sharded LayerNorms' parameter gradients over tp. Bytes per element
  follow what each tensor is under autocast (tp_element_bytes). On the critical path. Counted on
  the real modules: tests/unit/test_plan_tp_comm_counts.py.
- Pipeline (Narayanan et al. 2021): per micro-batch one b s h send forward from every virtual
  stage but the last and one backward from every one but the first, counted per rank (the
  busiest: 2 v m a step in the middle, (2 v - 1) m at pp 2; measured on torch's stage sends at
  pp 2, m 4: m a step at v 1, 3 m at v 2), of the residual stream's dtype (fp32 under autocast;
  16-bit where FSDP2's MixedPrecisionPolicy casts each Block's input) and, with sequence
  parallelism, each TP rank's sequence shard (s / t); the tied embedding's gradient is
  all-reduced between the first and last stage.
- ZeRO-Offload (Ren et al. 2021): fp32 gradient partition device->host every backward, updated
  16-bit partition host->device every step; ZeRO-3 param offload also fetches each partition from
  host for every gather.
"""
from __future__ import annotations

import math
from dataclasses import dataclass, asdict, replace

from . import mesh
from .flops import stage_layers
from .model_states import fsdp_root_params, local_params, persistent_params, tied, zero3_kept_gathered
from .spec import Layout, ModelSpec, Strategy

MiB = 2 ** 20
DDP_BUCKET_BYTES = 25 * MiB          # DistributedDataParallel bucket_cap_mb default (conf/strategy/ddp.yaml)
DDP_FIRST_BUCKET_BYTES = 1 * MiB     # torch.distributed _DEFAULT_FIRST_BUCKET_BYTES


@dataclass
class Collective:
    name: str              # what it is for
    op: str                # all_reduce | reduce_scatter | all_gather | p2p | host_copy
    group: str             # dp | tp | pp | host
    group_size: int
    bytes_per_call: float  # the buffer S (full size for reduce-scatter / all-gather)
    calls: float           # per optimizer step
    overlappable: bool     # may hide behind compute (bucketed DP sync, ZeRO-3/FSDP prefetch)
    crosses_nodes: bool = False
    impl: str = ""         # whose code issues it when not torch.distributed's own ("deepspeed")
    nodes: int = 1         # the nodes its group is on (collectives() sets it for crossing ones)

    @property
    def kind(self) -> str:
        """The key of its measured figures in a hardware profile's `collectives`."""
        return f"{self.op}@{self.impl}" if self.impl else self.op

    @property
    def bus_factor(self) -> float:
        n = self.group_size
        return {"all_reduce": 2 * (n - 1) / n, "reduce_scatter": (n - 1) / n,
                "all_gather": (n - 1) / n, "p2p": 1.0, "host_copy": 1.0}[self.op]

    @property
    def hops(self) -> float:
        """Latency terms per call (ring steps)."""
        n = self.group_size
        return {"all_reduce": 2 * (n - 1), "reduce_scatter": n - 1, "all_gather": n - 1,
                "p2p": 1, "host_copy": 0}[self.op]

    @property
    def inter_hops(self) -> float:
        """Of `hops`, those that cross the network: NCCL's rings visit a node's ranks in a row,
        so a ring over N nodes crosses between nodes 2 (N-1) times per all-reduce, N-1 per
        reduce-scatter or all-gather (NCCL src/graph/tuning.cc: nInterSteps); the other steps are
        inside a node, at its link's latency. Every hop at the network's latency made a 64-node
        data-parallel step latency-bound (1022 x 5 us per bucket; found by a planner review)."""
        if not self.crosses_nodes:
            return 0.0
        k = max(1, self.nodes) - 1
        return {"all_reduce": 2 * k, "reduce_scatter": k, "all_gather": k, "p2p": 1, "host_copy": 0}[self.op]

    @property
    def bytes_per_step(self) -> float:
        """Bytes each device sends per step (= S x bus factor x calls)."""
        return self.bytes_per_call * self.bus_factor * self.calls

    @property
    def latency_hops_per_step(self) -> float:
        return self.hops * self.calls

    def time_s(self, bandwidth: float, latency: float, intra_latency: float | None = None) -> float:
        """Ring time at `bandwidth` (the slowest link's) and `latency` per hop; a crossing
        collective's hops inside a node at `intra_latency` when given."""
        if self.crosses_nodes and intra_latency is not None:
            inter = self.inter_hops * self.calls
            lat = inter * latency + (self.latency_hops_per_step - inter) * intra_latency
        else:
            lat = self.latency_hops_per_step * latency
        return lat + self.bytes_per_step / bandwidth

    def as_dict(self) -> dict:
        d = asdict(self)
        d["bytes_per_step_per_device"] = self.bytes_per_step
        return d


def _buckets(size: float, bucket: float, first: float | None = None) -> int:
    if size <= 0:
        return 0
    if first is not None:
        return 1 + math.ceil(max(0.0, size - first) / bucket)
    return math.ceil(size / bucket)


def comm_element_bytes(strategy: Strategy, precision: str) -> tuple[int, int]:
    """(gradient, parameter) bytes per element on the wire. Autocast DDP keeps fp32 gradients;
    FSDP2 gathers 16-bit parameters under mixed precision and reduces in fp32 (scalelab's
    MixedPrecisionPolicy: reduce_dtype fp32, strategies/fsdp.py); DeepSpeed communicates 16-bit.
    bf16-true: the parameters and gradients themselves are bf16, and so is what they send (FSDP2's
    default policy reduces in the parameters' dtype)."""
    if precision == "bf16-true":
        return 2, 2
    if precision == "32" or strategy.family == "torch":
        return 4, 4
    if strategy.family == "fsdp":
        return (4, 2) if precision == "bf16-mixed" else (4, 4)
    return 2, 2


def _fsdp_under_pipeline(model, strategy, layout, psi, g, p) -> list[Collective]:
    """FSDP2 stages run by torch.distributed.pipelining (nd, also at pp 1: a one-stage schedule).
    Per micro-batch torch turns off resharding after backward and gradient sync, and runs FSDP's
    post-backward once at the step's end (model_states.fsdp_pipeline_buffers). With
    reshard_after_forward each Block is gathered for every forward but stays gathered from a
    backward to the next forward, so 1F1B and GPipe gather it m + 1 times a step; the stage's root
    (never resharded after forward) once; without resharding, everything once. One reduce-scatter
    per group at the step's end, after the last backward: not overlapped. HSDP (dp_replicate > 1):
    gathers and reduce-scatters inside the shard group, then FSDP2 all-reduces each reduced shard
    over the replicas."""
    n, m = layout.dp_shard, layout.micro_batches
    grp = "dp_shard" if layout.dp_replicate > 1 else "dp"
    dp_x = layout.group_spans_nodes(grp)
    v = layout.stages_per_rank                                  # (1 unless pp > 1: resolve_layout)
    per_stage = stage_layers(model.n_layers, layout.pp * v, layout.split, model)
    # the Blocks of the rank with the most (its chunks' under interleaving); the rest of psi is its
    # root part (embeddings on the first stage, final norm and head on the last)
    blocks = max(sum(per_stage[k] for k in range(r, layout.pp * v, layout.pp)) for r in range(layout.pp))
    block_elems = min(psi, blocks * model.layer_params / layout.tp)
    root = psi - block_elems
    gathers = m + 1 if strategy.reshard_after_forward else 1
    out = [Collective("param_all_gather_fwd", "all_gather", grp, n, block_elems * p / blocks,
                      blocks * gathers, True, dp_x)] if block_elems > 0 else []
    if root > 0:
        # a stage root is never resharded after forward (strategies/fsdp.py); interleaved chunks
        # are roots sharded with reshard_after_forward itself (strategies/nd.py)
        out.append(Collective("param_all_gather_root", "all_gather", grp, n, root * p,
                              gathers if v > 1 else 1, True, dp_x))
    out.append(Collective("grad_reduce_scatter", "reduce_scatter", grp, n, psi * g / (blocks + 1),
                          blocks + 1, False, dp_x))
    if layout.dp_replicate > 1:
        out.append(Collective("grad_all_reduce_replicas", "all_reduce", "dp_replicate", layout.dp_replicate,
                              psi * g / n / (blocks + 1), blocks + 1, False,
                              layout.group_spans_nodes("dp_replicate")))
    return out


def collectives(model: ModelSpec, strategy: Strategy, layout: Layout, precision: str,
                device: str = "gpu") -> list[Collective]:
    """What one device sends per optimizer step. `strategy` as applied (strategies.as_applied);
    `device` ("gpu" or "cpu", a hardware profile's kind) only changes the LayerNorms' output dtype
    under autocast with 16-bit parameters (tp_element_bytes)."""
    psi = local_params(model, layout)
    g, p = comm_element_bytes(strategy, precision)
    n, m = layout.dp, layout.micro_batches
    dp_x = layout.group_spans_nodes("dp")
    out: list[Collective] = []
    # one FSDP / ZeRO-3 unit per block + the root (embedding, head); under FSDP2 an MLP (no Blocks:
    # strategies/fsdp.py) is the root unit alone
    units = 1 if model.kind == "mlp" and strategy.family == "fsdp" else model.n_layers + 1

    if n > 1 and strategy.name != "single":
        if strategy.family == "torch" and strategy.local_sgd_period:
            # Post-local SGD: no gradient sync; the flattened parameters (fp32; bf16 under
            # bf16-true) are averaged (one all-reduce) every local_sgd_period steps, after the step.
            out.append(Collective("param_average_all_reduce", "all_reduce", "dp", n, psi * p,
                                  1 / strategy.local_sgd_period, False, dp_x))
        elif strategy.family == "torch" and strategy.powersgd_rank:
            # PowerSGD: per bucket one all-reduce of the uncompressed vectors, one of P, one of Q,
            # in the bucket's dtype (the gradients': fp32, bf16 under bf16-true)
            calls = 3 * _buckets(psi * g, DDP_BUCKET_BYTES, DDP_FIRST_BUCKET_BYTES)
            size = powersgd_elements(model, strategy.powersgd_rank) * psi / model.n_params * g
            out.append(Collective("dp_powersgd_all_reduce", "all_reduce", "dp", n, size / calls,
                                  calls, True, dp_x))
        elif strategy.family == "torch" and strategy.replicate_units:
            # replicate per Block and the root (module docstring): their sizes differ, the mean keeps the bytes
            calls = model.n_layers + 1 if model.kind == "gpt" else 1
            out.append(Collective("dp_grad_all_reduce", "all_reduce", "dp", n, psi * g / calls,
                                  calls, True, dp_x))
        elif strategy.family == "torch":
            calls = _buckets(psi * g, DDP_BUCKET_BYTES, DDP_FIRST_BUCKET_BYTES)   # of the gradients' dtype
            wire = strategy.grad_comm_bytes or g                                  # a compression hook's
            out.append(Collective("dp_grad_all_reduce", "all_reduce", "dp", n, psi * wire / calls,
                                  calls, True, dp_x))
        elif strategy.family == "fsdp" and strategy.pipeline:
            out += _fsdp_under_pipeline(model, strategy, layout, psi, g, p)
        elif strategy.shard_params:                   # fsdp, fsdp_grad_op, fsdp_tp, zero3(_offload)
            # ZeRO-3 never gathers the tensors it keeps whole (persistence threshold; all of them
            # on tiny models); their gradients are still reduce-scattered into the partition.
            gathered = psi - persistent_params(model, strategy, psi)
            if gathered > 0:
                out.append(Collective("param_all_gather_fwd", "all_gather", "dp", n,
                                      gathered * p / units, units * m, True, dp_x))
            # ZeRO-3 gathers again in the backward only what its coordinator released after the
            # forward (model_states.zero3_kept_gathered: nothing, up to ~1e9 parameters)
            regathered = gathered - zero3_kept_gathered(model, strategy, layout)   # (at most gathered)
            bwd_units = units
            if strategy.family == "fsdp":
                # FSDP2's root (embeddings, final norm, head; the whole of a model without
                # Blocks) is not resharded after forward (strategies/fsdp.py): the backward
                # gathers the Blocks only
                regathered = max(0.0, regathered - fsdp_root_params(model, psi))
                bwd_units = model.n_layers
            if regathered > 0 and strategy.reshard_after_forward:
                out.append(Collective("param_all_gather_bwd", "all_gather", "dp", n,
                                      regathered * p / bwd_units, bwd_units * m, True, dp_x))
            out.append(Collective("grad_reduce_scatter", "reduce_scatter", "dp", n, psi * g / units,
                                  units * m, True, dp_x))
        else:                                          # zero1, zero2(_offload)
            per_step = 1 if strategy.zero_stage == 1 else m
            b = _buckets(psi, strategy.reduce_bucket_elements)
            # in backward hooks (stage 1: at every boundary) with overlap_comm; else after backward
            overlapped = strategy.overlap_comm and (strategy.zero_stage == 2 or m == 1)
            out.append(Collective("grad_reduce_scatter", "reduce_scatter", "dp", n, psi * g / b,
                                  b * per_step, overlapped, dp_x))
            ag = _buckets(psi, strategy.allgather_bucket_elements)
            out.append(Collective("param_all_gather", "all_gather", "dp", n, psi * p / ag, ag, False, dp_x))

    if strategy.offload_optimizer:
        out.append(Collective("grad_to_host", "host_copy", "host", 1, psi / n * 4,
                              m if strategy.zero_stage else 1, False))
        # offloaded parameters come from the host for each forward, and again for the backward
        # what ZeRO-3 released after the forward (model_states.zero3_kept_gathered)
        fetches = 1
        if strategy.offload_params:
            gathered = psi - persistent_params(model, strategy, psi)
            kept = zero3_kept_gathered(model, strategy, layout)
            fetches += m * (1 + ((gathered - kept) / gathered if gathered > 0 else 0.0))
        out.append(Collective("param_from_host", "host_copy", "host", 1, psi / n * p, fetches, False))

    if layout.tp > 1 and model.kind == "gpt":
        out += tp_collectives(model, strategy, layout, precision, device)

    if layout.pp > 1:
        r = tp_element_bytes(strategy, layout, precision, device)["residual"]
        shard = layout.tp if layout.sequence_parallel and layout.tp > 1 else 1
        act = layout.micro_batch * model.seq_len * model.hidden * r / shard
        pp, v, dpn = layout.pp, layout.stages_per_rank, layout.devices_per_node
        # per rank from its virtual stages (not 2 m: an end rank of a 2-stage pipeline sends m, an
        # interleaved middle one 2 v m); the busiest rank binds the step, and only its sends to
        # another node go over the network (mesh.worst_rank_sends)
        cross, sends = mesh.worst_rank_sends(pp, layout.dp, layout.tp, v, dpn)
        if cross:
            out.append(Collective("pp_activation_send", "p2p", "pp", pp, act, cross * m, False, True, nodes=2))
        if sends > cross:
            out.append(Collective("pp_activation_send_in_node" if cross else "pp_activation_send", "p2p", "pp",
                                  pp, act, (sends - cross) * m, False))
        if model.kind == "gpt" and tied(model):
            # Megatron's tied embedding: the last stage's copy and the first's all-reduce their
            # gradient (model_states.local_params); an untied head, as scalelab's GPT, has none
            ends_x = mesh.pp_ends_cross_nodes(pp, layout.dp, layout.tp, dpn)
            out.append(Collective("pp_tied_embedding_all_reduce", "all_reduce", "pp", 2,
                                  model.vocab * model.hidden / layout.tp * g, 1, False, ends_x,
                                  nodes=2 if ends_x else 1))
    if strategy.family == "deepspeed":
        # ZeRO's collectives are DeepSpeed's own code (partitioned reduces for stage 1/2,
        # coalesced gathers for stage 3): a profile may give them their own figures
        # ("reduce_scatter@deepspeed"); --calibrate fits one per op (separate ones fitted noise).
        out = [replace(c, impl="deepspeed") if c.group == "dp" else c for c in out]
    # a crossing collective still at nodes=1 spans its group kind's worst group's nodes (the
    # pipeline's, between two ranks, set theirs above)
    return [replace(c, nodes=layout.group_nodes(c.group)) if c.crosses_nodes and c.nodes == 1 else c
            for c in out]


def _wrapped_by_fsdp2(strategy: Strategy, layout: Layout) -> bool:
    """FSDP2's fully_shard (fsdp_tp; nd at dp > 1, which as_applied keeps in the fsdp family) or
    its replicate (tp at dp > 1: strategies/tensor_parallel.py) wraps the TP model."""
    return strategy.family == "fsdp" or (strategy.tensor_parallel and not strategy.pipeline and layout.dp > 1)


def tp_element_bytes(strategy: Strategy, layout: Layout, precision: str, device: str = "gpu") -> dict[str, int]:
    """Bytes per element of the tensors TP and the pipeline send, as measured on the real modules
    (tests/unit/test_plan_tp_comm_counts.py):
    - compute: matmul outputs (row-parallel outputs, logits, their gradients): 16-bit under autocast;
    - residual: the residual stream (embedding sum, Block outputs, pipeline sends): fp32 under plain
      autocast (fp32 embeddings and adds: activations.RESIDUAL_BYTES), 16-bit where FSDP2's
      MixedPrecisionPolicy (bf16-mixed: param_dtype bf16) casts the weights and each Block's input;
    - norm: LayerNorm outputs (the column-parallel inputs, whose gradients are all-reduced backward):
      the residual's dtype, except that CUDA autocast runs layer_norm in fp32 (its fp32 op list;
      CPU autocast runs it in its input's dtype);
    bf16-true: the whole module is bf16, every one of them 16-bit."""
    if precision == "bf16-true":
        return {"compute": 2, "residual": 2, "norm": 2}
    c = 4 if precision == "32" else 2
    cast = precision == "bf16-mixed" and _wrapped_by_fsdp2(strategy, layout)
    r = 2 if cast else 4
    return {"compute": c, "residual": r, "norm": 2 if cast and device == "cpu" else 4}


def tp_collectives(model: ModelSpec, strategy: Strategy, layout: Layout, precision: str,
                   device: str = "gpu") -> list[Collective]:
    """TP's collectives per step of the pipeline rank that sends the most (tp_rank_collectives)."""
    ranks = [tp_rank_collectives(model, strategy, layout, precision, device, r) for r in range(layout.pp)]
    return max(ranks, key=lambda cs: sum(c.bytes_per_step for c in cs))


def tp_rank_collectives(model: ModelSpec, strategy: Strategy, layout: Layout, precision: str,
                        device: str, rank: int) -> list[Collective]:
    """TP's collectives per step of pipeline rank `rank` (module docstring): its Blocks (its
    virtual stages' under interleaving), the embedding on rank 0, the head on the last rank. Per
    micro-batch each, except the LayerNorm parameter gradients under sequence parallelism:
    FSDP2's post-backward reduces them per backward, or once a step under a pipeline schedule (as
    its reduce-scatter: _fsdp_under_pipeline), and tp's replicate once a step (it syncs on the
    last micro-batch only); plain TP leaves them Partial (none sent)."""
    t, m, pp, v = layout.tp, layout.micro_batches, layout.pp, layout.stages_per_rank
    e = tp_element_bytes(strategy, layout, precision, device)
    bsh = layout.micro_batch * model.seq_len * model.hidden
    bsv = layout.micro_batch * model.seq_len * model.vocab
    per_stage = stage_layers(model.n_layers, pp * v, layout.split, model)
    nl = sum(per_stage[k] for k in range(rank, pp * v, pp))
    first, last = int(rank == 0), int(rank == pp - 1)
    # (name, op, S bytes, calls per micro-batch)
    if not layout.sequence_parallel:
        rows = [("tp_row_all_reduce", "all_reduce", bsh * e["compute"], 2 * nl),
                ("tp_embedding_all_reduce", "all_reduce", bsh * e["residual"], first),
                ("tp_logits_all_gather", "all_gather", bsv * e["compute"], last),
                ("tp_column_grad_all_reduce", "all_reduce", bsh * e["norm"], 4 * nl + last)]
    else:
        rows = [("tp_embedding_all_reduce", "all_reduce", bsh * e["residual"], first),
                ("tp_norm_all_gather", "all_gather", bsh * e["norm"], 2 * nl + last),
                ("tp_row_reduce_scatter", "reduce_scatter", bsh * e["compute"], 2 * nl),
                ("tp_logits_all_gather", "all_gather", bsv * e["compute"], last),
                ("tp_norm_grad_reduce_scatter", "reduce_scatter", bsh * e["norm"], 2 * nl + last),
                ("tp_row_grad_all_gather", "all_gather", bsh * e["compute"], 2 * nl),
                ("tp_embedding_grad_all_gather", "all_gather", bsh * e["residual"], first)]
    x = layout.group_spans_nodes("tp")
    out = [Collective(n, op, "tp", t, size, k * m, False, x) for n, op, size, k in rows if k]
    if layout.sequence_parallel and _wrapped_by_fsdp2(strategy, layout):
        # weight and bias of each sequence-parallel LayerNorm (ln1, ln2, ln_f), parameter dtype
        out.append(Collective("tp_layernorm_grad_all_reduce", "all_reduce", "tp", t, model.hidden * e["residual"],
                              2 * (2 * nl + last) * (1 if strategy.pipeline or strategy.replicate_units else m),
                              False, x))
    return out


def powersgd_elements(model: ModelSpec, rank: int) -> float:
    """Values PowerSGD all-reduces per step for the whole model (Vogels et al. 2019): an n x m
    weight becomes P (n x r) and Q (m x r); torch compresses a matrix only when that is at least
    2x smaller (min_compression_rate=2); vectors (biases, LayerNorms) go uncompressed."""
    h, f = model.hidden, model.ffn
    if model.kind == "gpt":
        # scalelab-train's q, k, v, out are four Linears (Megatron fuses qkv), and its untied head
        # is one more (V, h) matrix: sent whole as "the rest" before, 126x the traffic at vocab 50257
        attention = [(h, h)] * 4 if model.trainer_built else [(3 * h, h), (h, h)]
        mats = (attention + [(f, h), (h, f)]) * model.n_layers + [(model.vocab, h), (model.seq_len, h)]
        mats += [(model.vocab, h)] if model.untied_head else []
    else:
        mats = [(h, h)] * model.n_layers
    full = sum(a * b for a, b in mats)
    sent = sum(rank * (a + b) if 2 * rank * (a + b) < a * b else a * b for a, b in mats)
    return max(0, model.n_params - full) + sent


def by_op(colls: list[Collective]) -> dict[str, float]:
    """Bytes per step per device, summed by collective type (device links only)."""
    d: dict[str, float] = {}
    for c in colls:
        d[c.op] = d.get(c.op, 0.0) + c.bytes_per_step
    return d

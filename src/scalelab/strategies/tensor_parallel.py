"""`tp` (Megatron-style tensor parallelism) and `fsdp_tp` (2-D: FSDP2 over dp x TP), with
torch's DTensor parallel styles (torch.distributed.tensor.parallel.parallelize_module).

The GPT stays a plain nn.Module; `apply_tensor_parallel` shards it on the tensor-parallel mesh:
- attention: q_proj, k_proj, v_proj column-parallel (each rank computes its n_heads/tp heads;
  the model's attention reshapes with -1 heads), out_proj row-parallel (one all-reduce);
- MLP: up column-parallel, down row-parallel (one all-reduce);
- tok_emb: vocab-parallel embedding (`VocabParallelEmbedding`, hand-written on DTensor): the
  table is sharded along the vocabulary (dim 0), each rank looks up the ids it owns (others give
  zero) and an all-reduce sums the partial embeddings; its gradient stays sharded;
- lm_head: ColwiseParallel(output_layouts=Replicate()): the head is sharded along the vocabulary
  and the logits are all-gathered, so the unchanged cross-entropy sees full logits (a stated
  alternative to loss-parallel, which would need the loss computed on vocab-sharded logits).
Each rank of a TP group therefore computes the same loss, and the group reads the same
samples (dp_rank = global_rank // tp).

What stays replicated on every TP rank (the unshardable remainder of TP's parameter bytes):
pos_emb and the LayerNorm weights/biases (ln1, ln2, ln_f). Their inputs are replicated, so
they run redundantly on every rank; they are made Replicate DTensors (`ReplicateParallel`) so
that all parameters are DTensors on the TP mesh (the optimizer's foreach kernels and gradient
clipping cannot mix plain tensors and DTensors), and their gradients are identical on every
TP rank because the gradients entering them are all-reduced by the column-parallel layers'
backward. For gpt_nano that remainder is 64*64 + 5*2*64 = 4,736 of 135,808 parameters, so a
rank holds (135,808 - 4,736) / tp + 4,736 = 70,272 at tp=2: 0.517 of the full model, not 0.5.

`sequence_parallel: true` (tp, fsdp_tp, nd) also shards the LayerNorm regions along the sequence
(tensor_parallel_plan); its activation bytes: plan/activations.py.

With `tp` at tensor_parallel_size < world size the dp replicas synchronise gradients with
FSDP2's `replicate` (DDP built on FSDP2, DTensor-aware) over the data-parallel mesh, applied as
fsdp applies fully_shard: each Block, then the root (`apply_replicate`). Each unit all-reduces its
gradients in its own post-backward hook, as soon as its backward is done and while the Blocks
below still compute (the overlap DDP gets from its buckets); the root alone would all-reduce every
gradient in one call after the whole backward. Under gradient accumulation the replicas sync on
the last micro-batch only (model_parallel.replica_sync_off, DDP's no_sync): plan/comm.py counts
one all-reduce per unit and step.
"""
from __future__ import annotations

import types
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

from scalelab.errors import ConfigError
from scalelab.strategies.base import RunSpec
from scalelab.strategies.fsdp import apply_fsdp, fsdp_units, mixed_precision_policy
from scalelab.strategies.model_parallel import MeshParallelPlan, divisors


def _replicate_style():
    from torch.distributed.tensor import DTensor, Replicate, distribute_module
    from torch.distributed.tensor.parallel.style import ParallelStyle

    class ReplicateParallel(ParallelStyle):
        """Parameters become Replicate DTensors; plain-tensor inputs are taken as replicated
        and the output is returned as a plain tensor (torchtitan's NoParallel)."""

        def _apply(self, module: nn.Module, device_mesh) -> nn.Module:
            def to_dtensor(mod, inputs, mesh):
                return tuple(DTensor.from_local(x, mesh, (Replicate(),), run_check=False)
                             if isinstance(x, torch.Tensor) and not isinstance(x, DTensor) else x
                             for x in inputs)

            def to_local(mod, outputs, mesh):
                return outputs.to_local() if isinstance(outputs, DTensor) else outputs

            return distribute_module(module, device_mesh, None, input_fn=to_dtensor, output_fn=to_local)

    return ReplicateParallel()


def _vocab_parallel_forward(self: nn.Embedding, ids: torch.Tensor) -> torch.Tensor:
    from torch.distributed.tensor import DTensor, Partial, Replicate

    w = self.weight  # DTensor, Shard(0) on the 1-D tensor-parallel mesh
    mesh, local = w.device_mesh, w.to_local()
    start = mesh.get_local_rank() * local.shape[0]  # equal shards: tp divides the vocab (preflight)
    ids = ids.to_local() if isinstance(ids, DTensor) else ids
    outside = (ids < start) | (ids >= start + local.shape[0])
    out = F.embedding((ids - start).masked_fill(outside, 0), local).masked_fill(outside.unsqueeze(-1), 0.0)
    # sum of the partial lookups (all-reduce forward; backward passes the replicated gradient)
    return DTensor.from_local(out, mesh, (Partial(),), run_check=False).redistribute(mesh, (Replicate(),)).to_local()


def _vocab_parallel_style():
    from torch.distributed.tensor import Shard, distribute_module, distribute_tensor
    from torch.distributed.tensor.parallel.style import ParallelStyle

    class VocabParallelEmbedding(ParallelStyle):
        """Megatron's VocabParallelEmbedding, hand-written on DTensor (a plugin where DTensor's
        own style falls short): the table is Shard(0) along the vocabulary; each rank looks up
        the ids in its rows (zeros for the others) and an all-reduce sums the partial results.
        DTensor's RowwiseParallel(input_layouts=Replicate()) on an nn.Embedding computes the
        same forward, but its backward yields a full Replicate (vocab, d) gradient on every TP
        rank; here the gradient flows through to_local() into the local rows only, so it is
        Shard(0) like the parameter (1/tp of the table)."""

        def _apply(self, module: nn.Module, device_mesh) -> nn.Module:
            def shard_rows(name, mod, mesh):
                for pn, p in list(mod.named_parameters(recurse=False)):
                    mod.register_parameter(pn, nn.Parameter(distribute_tensor(p, mesh, (Shard(0),))))

            distribute_module(module, device_mesh, shard_rows)
            module.forward = types.MethodType(_vocab_parallel_forward, module)
            return module

    return VocabParallelEmbedding()


def tensor_parallel_plan(net: nn.Module, sequence_parallel: bool = False) -> dict[str, Any]:
    """The parallelize_module plan for scalelab.models.gpt.GPT (module FQN -> style).

    sequence_parallel (Korthikanti et al. 2022; torchtitan's llama parallelize): between the
    column/row-parallel pairs the residual stream is sharded along the sequence (dim 1) instead of
    replicated, so the LayerNorms (SequenceParallel) run on s/t positions and their inputs are
    stored once per TP group. Each attention / MLP input is all-gathered (PrepareModuleInput
    Shard(1) -> Replicate), and the row-parallel out_proj / down reduce-scatter into the sequence
    shard (RowwiseParallel(output_layouts=Shard(1))) instead of all-reducing: the same bytes moved.
    Ends: the first block of stage 0 takes the replicated embedding sum and keeps its own sequence
    shard (Replicate -> Shard(1), a local slice; backward all-gathers its gradient); ln_f runs on the
    shard and lm_head gathers it (ColwiseParallel(input_layouts=Shard(1))) and all-gathers the
    logits as without SP, so the unchanged cross-entropy sees full logits on every TP rank."""
    from torch.distributed.tensor import Replicate, Shard
    from torch.distributed.tensor.parallel import (ColwiseParallel, PrepareModuleInput, RowwiseParallel,
                                                   SequenceParallel)

    sp = bool(sequence_parallel)
    head = ColwiseParallel(input_layouts=Shard(1), output_layouts=Replicate()) if sp else \
        ColwiseParallel(output_layouts=Replicate())   # vocab-sharded head, gathered logits
    plan: dict[str, Any] = {"tok_emb": _vocab_parallel_style(), "lm_head": head}
    if sp:
        plan["ln_f"] = SequenceParallel()
    # a pipeline stage (strategies/pipeline.py make_stage) has set the ends it does not own to None
    plan = {k: v for k, v in plan.items() if getattr(net, k, None) is not None}
    row_out = Shard(1) if sp else Replicate()
    for i in net.layers:
        b = f"layers.{i}"
        plan.update({f"{b}.attn.q_proj": ColwiseParallel(), f"{b}.attn.k_proj": ColwiseParallel(),
                     f"{b}.attn.v_proj": ColwiseParallel(),
                     f"{b}.attn.out_proj": RowwiseParallel(output_layouts=row_out),
                     f"{b}.mlp.up": ColwiseParallel(), f"{b}.mlp.down": RowwiseParallel(output_layouts=row_out)})
        if sp:
            gather = dict(input_layouts=(Shard(1),), desired_input_layouts=(Replicate(),))
            plan.update({f"{b}.ln1": SequenceParallel(), f"{b}.ln2": SequenceParallel(),
                         f"{b}.attn": PrepareModuleInput(**gather), f"{b}.mlp": PrepareModuleInput(**gather)})
    if sp and getattr(net, "tok_emb", None) is not None and len(net.layers):
        first = f"layers.{next(iter(net.layers))}"   # the embedding sum enters the sequence-sharded region
        plan[first] = PrepareModuleInput(input_layouts=(Replicate(),), desired_input_layouts=(Shard(1),),
                                         use_local_output=True)
    return plan


def apply_tensor_parallel(net: nn.Module, tp_mesh: Any, sequence_parallel: bool = False) -> nn.Module:
    from torch.distributed.tensor import DTensor
    from torch.distributed.tensor.parallel import parallelize_module

    parallelize_module(net, tp_mesh, tensor_parallel_plan(net, sequence_parallel))
    replicate = _replicate_style()
    for name, mod in list(net.named_modules()):  # pos_emb and LayerNorms: see the module docstring
        own = list(mod.parameters(recurse=False))
        if own and not any(isinstance(p, DTensor) for p in own):
            parallelize_module(mod, tp_mesh, replicate)
    return net


def apply_replicate(net: nn.Module, dp_mesh: Any, precision: str) -> nn.Module:
    """FSDP2's replicate over the data-parallel mesh: each Block, then the root (the embeddings,
    final LayerNorm and head; the whole of a model without Blocks), so that each Block's gradients
    are all-reduced by its own post-backward hook while the backward goes on (module docstring)."""
    from torch.distributed._composable.replicate_with_fsdp import replicate

    kw = dict(mesh=dp_mesh, mp_policy=mixed_precision_policy(precision))
    for unit in fsdp_units(net):
        replicate(unit, **kw)
    replicate(net, **kw)
    return net


def check_tp_degree(name: str, tp: int, run: RunSpec, option: str = "tensor_parallel_size") -> None:
    """Preflight: the TP degree must divide the world size, heads, width, MLP width and vocab
    (`option`: the strategy's key for the degree, named in the error)."""
    from scalelab.models.gpt import GPTConfig

    arch = run.model_arch
    if not isinstance(arch, GPTConfig):
        raise ConfigError(f"strategy={name} tensor-parallelizes the GPT models only; "
                          f"got {type(arch).__name__}: choose a gpt model (model=gpt_nano, gpt_small)")
    sizes = {"world size": run.world_size, "model n_heads": arch.n_heads, "model d_model": arch.d_model,
             "MLP width": arch.mlp_ratio * arch.d_model, "vocab_size": arch.vocab_size}
    valid = [d for d in divisors(run.world_size) if all(v % d == 0 for v in sizes.values())]
    for what, v in sizes.items():
        if v % tp:
            raise ConfigError(f"strategy={name}: strategy.{option}={tp} does not divide {what} {v}: "
                              f"choose one of {', '.join(map(str, valid))}")


def check_sequence_parallel(value: Any) -> bool:
    if not isinstance(value, bool):
        raise ConfigError(f"strategy.sequence_parallel={value!r} must be true or false")
    return value


def check_sequence_length(name: str, tp: int, run: RunSpec, option: str) -> None:
    """Sequence parallel cuts each sequence into tp equal shards (DTensor Shard(1) from local
    tensors assumes equal shards)."""
    seq = getattr(run.model_arch, "seq_len", None)
    if tp > 1 and seq is not None and seq % tp:
        raise ConfigError(f"strategy={name}: strategy.sequence_parallel=true shards each sequence of model "
                          f"seq_len {seq} over strategy.{option}={tp} ranks, which does not divide it: use a "
                          f"{option} that divides {seq}, or sequence_parallel=false")


class TensorParallel(MeshParallelPlan):
    """`tp`: tensor parallelism over groups of `tensor_parallel_size` consecutive ranks
    ("auto": all ranks); several groups (dp > 1) replicate the model with FSDP2's replicate
    (apply_replicate)."""

    name = "tp"
    shard_data_parallel = False  # fsdp_tp: FSDP2 over the dp mesh instead of replicate

    def __init__(self, name: str = "tp", tensor_parallel_size: int | str = "auto",
                 reshard_after_forward: bool = True, save_distributed_checkpoint: bool = True,
                 sequence_parallel: bool = False, **options: Any):
        super().__init__(name, save_distributed_checkpoint=save_distributed_checkpoint, **options)
        self.sequence_parallel = check_sequence_parallel(sequence_parallel)
        if tensor_parallel_size != "auto" and (not isinstance(tensor_parallel_size, int)
                                               or isinstance(tensor_parallel_size, bool)
                                               or tensor_parallel_size < 1):
            raise ConfigError(f"strategy.tensor_parallel_size={tensor_parallel_size!r} must be a positive "
                              "integer or auto (all ranks)")
        self.tensor_parallel_size = tensor_parallel_size
        self.reshard_after_forward = bool(reshard_after_forward)

    def tp_size(self, world_size: int) -> int:
        return world_size if self.tensor_parallel_size == "auto" else int(self.tensor_parallel_size)

    def validate(self, run: RunSpec) -> None:
        tp = self.tp_size(run.world_size)
        check_tp_degree(self.name, tp, run)
        if self.sequence_parallel:
            check_sequence_length(self.name, tp, run, option="tensor_parallel_size")
        super().validate(run)

    def record_fields(self, per_rank: list[Any], warmup_steps: int, profiled_steps: int = 0) -> dict:
        # what ran: at tp 1 (auto on one rank, or tensor_parallel_size=1) there is no sequence to
        # shard, parallelize() applies no TP plan, and the run must not read as sequence-parallel
        return {"sequence_parallel": self.sequence_parallel and self.tp_size(len(per_rank)) > 1}

    def parallelize(self, net: nn.Module, device_mesh: Any) -> nn.Module:
        tp_mesh, dp_mesh = device_mesh["tensor_parallel"], device_mesh["data_parallel"]
        if tp_mesh.size() > 1:
            apply_tensor_parallel(net, tp_mesh, self.sequence_parallel)
        if self.shard_data_parallel:
            net = apply_fsdp(net, dp_mesh, self.precision, self.reshard_after_forward)
        elif dp_mesh.size() > 1:
            net = apply_replicate(net, dp_mesh, self.precision)
        return net


class FSDPTensorParallel(TensorParallel):
    """`fsdp_tp`: 2-D parallelism. TP inside groups of `tensor_parallel_size` consecutive ranks
    (put them on one node: TP communicates every layer), FSDP2 across the groups: each
    TP-sharded parameter is sharded again along dim 0 over the data-parallel mesh."""

    name = "fsdp_tp"
    shard_data_parallel = True

    def __init__(self, name: str = "fsdp_tp", tensor_parallel_size: int | str = 2, **kw: Any):
        super().__init__(name, tensor_parallel_size=tensor_parallel_size, **kw)

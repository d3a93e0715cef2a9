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

With `tp` at tensor_parallel_size < world size the dp replicas synchronise gradients with
FSDP2's `replicate` (DDP built on FSDP2, DTensor-aware) over the data-parallel mesh.
"""
from __future__ import annotations

import types
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

from scalelab.errors import ConfigError
from scalelab.strategies.base import RunSpec
from scalelab.strategies.fsdp import apply_fsdp, mixed_precision_policy
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


def tensor_parallel_plan(net: nn.Module) -> dict[str, Any]:
    """The parallelize_module plan for scalelab.models.gpt.GPT (module FQN -> style)."""
    from torch.distributed.tensor import Replicate
    from torch.distributed.tensor.parallel import ColwiseParallel, RowwiseParallel

    plan: dict[str, Any] = {
        "tok_emb": _vocab_parallel_style(),                       # vocab-parallel embedding
        "lm_head": ColwiseParallel(output_layouts=Replicate()),   # vocab-sharded head, gathered logits
    }
    # a pipeline stage (strategies/pipeline.py make_stage) has set the ends it does not own to None
    plan = {k: v for k, v in plan.items() if getattr(net, k, None) is not None}
    for i in net.layers:
        b = f"layers.{i}"
        plan.update({f"{b}.attn.q_proj": ColwiseParallel(), f"{b}.attn.k_proj": ColwiseParallel(),
                     f"{b}.attn.v_proj": ColwiseParallel(), f"{b}.attn.out_proj": RowwiseParallel(),
                     f"{b}.mlp.up": ColwiseParallel(), f"{b}.mlp.down": RowwiseParallel()})
    return plan


def apply_tensor_parallel(net: nn.Module, tp_mesh: Any) -> nn.Module:
    from torch.distributed.tensor import DTensor
    from torch.distributed.tensor.parallel import parallelize_module

    parallelize_module(net, tp_mesh, tensor_parallel_plan(net))
    replicate = _replicate_style()
    for name, mod in list(net.named_modules()):  # pos_emb and LayerNorms: see the module docstring
        own = list(mod.parameters(recurse=False))
        if own and not any(isinstance(p, DTensor) for p in own):
            parallelize_module(mod, tp_mesh, replicate)
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


class TensorParallel(MeshParallelPlan):
    """`tp`: tensor parallelism over groups of `tensor_parallel_size` consecutive ranks
    ("auto": all ranks); several groups (dp > 1) replicate the model with FSDP2's replicate."""

    name = "tp"
    shard_data_parallel = False  # fsdp_tp: FSDP2 over the dp mesh instead of replicate

    def __init__(self, name: str = "tp", tensor_parallel_size: int | str = "auto",
                 reshard_after_forward: bool = True, save_distributed_checkpoint: bool = True,
                 **options: Any):
        super().__init__(name, save_distributed_checkpoint=save_distributed_checkpoint, **options)
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
        check_tp_degree(self.name, self.tp_size(run.world_size), run)
        super().validate(run)

    def parallelize(self, net: nn.Module, device_mesh: Any) -> nn.Module:
        tp_mesh, dp_mesh = device_mesh["tensor_parallel"], device_mesh["data_parallel"]
        if tp_mesh.size() > 1:
            apply_tensor_parallel(net, tp_mesh)
        if self.shard_data_parallel:
            return apply_fsdp(net, dp_mesh, self.precision, self.reshard_after_forward)
        if dp_mesh.size() > 1:
            from torch.distributed._composable.replicate_with_fsdp import replicate

            replicate(net, mesh=dp_mesh, mp_policy=mixed_precision_policy(self.precision))
        return net


class FSDPTensorParallel(TensorParallel):
    """`fsdp_tp`: 2-D parallelism. TP inside groups of `tensor_parallel_size` consecutive ranks
    (put them on one node: TP communicates every layer), FSDP2 across the groups: each
    TP-sharded parameter is sharded again along dim 0 over the data-parallel mesh."""

    name = "fsdp_tp"
    shard_data_parallel = True

    def __init__(self, name: str = "fsdp_tp", tensor_parallel_size: int | str = 2, **kw: Any):
        super().__init__(name, tensor_parallel_size=tensor_parallel_size, **kw)

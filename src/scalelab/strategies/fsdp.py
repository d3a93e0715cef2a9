"""`fsdp` (FULL_SHARD) and `fsdp_grad_op` (SHARD_GRAD_OP): PyTorch FSDP2 (`fully_shard`).

Each GPT Block is one FSDP unit (its parameters are all-gathered just before its forward and
freed after it), then the root takes what is left (embeddings, final LayerNorm, head).
Parameters, gradients and Adam state are DTensors sharded along dim 0 over the data-parallel
ranks, so each rank holds 1/dp of each.

- FULL_SHARD (`reshard_after_forward: true`): each Block's parameters are freed after forward and
  gathered again for backward: 2 all-gathers + 1 reduce-scatter per step, least memory. The root
  (embeddings, final LayerNorm, head) is not resharded after forward (torch's own default for the
  root, reshard_after_forward=None; torchtitan keeps its last layers the same way): the backward
  starts with the head, so it would be gathered again at once; this saves that all-gather (a
  vocabulary x width matrix or two per step). The root is then also held through the loss (the
  logits' cross-entropy and its backward), where it used to be sharded; at the start of the
  backward, the activations' peak, it was gathered anyway.
- SHARD_GRAD_OP (`reshard_after_forward: false`): the gathered parameters stay from forward to
  the end of backward: 1 all-gather + 1 reduce-scatter, full parameters live during the step.
  Gradients and optimizer state stay sharded; the measured per-rank bytes (taken after the
  step, when parameters are resharded) equal FULL_SHARD's.

Mixed precision is FSDP2's MixedPrecisionPolicy, chosen from trainer.precision:
32-true: fp32 throughout; bf16-mixed: bf16 compute copies of the parameters with fp32 master
parameters and fp32 gradient reduce-scatter (Lightning's autocast stays on for the ops FSDP does
not see); bf16-true: the parameters themselves are bf16 (Lightning casts the already sharded
module in its setup; FSDP2 follows the cast: its state bytes are half of fp32's).
Checkpoints are sharded torch.distributed.checkpoint folders (one file per rank).
"""
from __future__ import annotations

from typing import Any

import torch
from torch import nn

from scalelab.strategies.model_parallel import MeshParallelPlan


def mixed_precision_policy(precision: str):
    """FSDP2 MixedPrecisionPolicy for a Lightning precision string."""
    from torch.distributed.fsdp import MixedPrecisionPolicy

    if precision == "bf16-mixed":
        return MixedPrecisionPolicy(param_dtype=torch.bfloat16, reduce_dtype=torch.float32)
    return MixedPrecisionPolicy()  # 32-true: all fp32; bf16-true: the parameters already are bf16


def fsdp_units(net: nn.Module) -> list[nn.Module]:
    """The modules wrapped one by one before the root: every transformer Block (the GPT's
    layers); a model without blocks (the MLP classifier) is one unit, the root."""
    from scalelab.models.gpt import Block

    return [m for m in net.modules() if isinstance(m, Block)]


def apply_fsdp(net: nn.Module, dp_mesh: Any, precision: str, reshard_after_forward: bool = True) -> nn.Module:
    """fully_shard each Block, then the root, over the data-parallel mesh. Parameters that are
    already tensor-parallel DTensors (fsdp_tp) are sharded a second time along dp (2-D)."""
    from torch.distributed.fsdp import fully_shard

    kw = dict(mesh=dp_mesh, reshard_after_forward=reshard_after_forward,
              mp_policy=mixed_precision_policy(precision))
    for unit in fsdp_units(net):
        fully_shard(unit, **kw)
    # the root: None = torch's default, not resharded after forward (module docstring)
    fully_shard(net, **{**kw, "reshard_after_forward": None if reshard_after_forward else False})
    return net


class FSDP(MeshParallelPlan):
    """Data-parallel only (tensor_parallel_size 1): the mesh is (world, 1)."""

    name = "fsdp"

    def __init__(self, name: str = "fsdp", reshard_after_forward: bool = True,
                 save_distributed_checkpoint: bool = True, **options: Any):
        super().__init__(name, save_distributed_checkpoint=save_distributed_checkpoint, **options)
        self.reshard_after_forward = bool(reshard_after_forward)

    def validate(self, run: Any) -> None:
        super().validate(run)
        # fsdp with reshard_after_forward=false ran SHARD_GRAD_OP as "fsdp" in every table
        other = {("fsdp", False): "fsdp_grad_op", ("fsdp_grad_op", True): "fsdp"}.get(
            (self.name, self.reshard_after_forward))
        if other:
            from scalelab.errors import ConfigError

            raise ConfigError(f"strategy={self.name}: strategy.reshard_after_forward={str(self.reshard_after_forward).lower()} "
                              f"is strategy={other}'s (tables, W&B and the planner name a run by its strategy): use "
                              f"strategy={other}")

    def parallelize(self, net: nn.Module, device_mesh: Any) -> nn.Module:
        return apply_fsdp(net, device_mesh["data_parallel"], self.precision, self.reshard_after_forward)

"""Shared base of the mesh-parallel strategies (`fsdp`, `fsdp_grad_op`, `tp`, `fsdp_tp`).

All of them run on Lightning's ModelParallelStrategy: Lightning builds a 2-D device mesh
(data_parallel x tensor_parallel; rank = dp_index * tp + tp_index) and then calls
LightningModule.configure_model, where LitModule calls `plan.parallelize(net, device_mesh)`.
Lightning calls configure_model BEFORE configure_optimizers (Trainer._run: configure_model,
then strategy.setup -> setup_optimizers), so the optimizer is built over the sharded (DTensor)
parameters and its state is sharded too. Checkpoints are torch.distributed.checkpoint folders
(one shard file per rank + Lightning's metadata), restored into the sharded model in place.

Gradient accumulation: Lightning's ModelParallelStrategy inherits ParallelStrategy's
block_backward_sync, which skips the gradient sync of a DistributedDataParallel module only; an
FSDP2 `replicate` module (tp at dp > 1) all-reduced its gradients on every micro-batch. The
strategy here (`_mesh_strategy_class`) turns the replicas' sync off while Lightning accumulates
(`replica_sync_off`), as DDP's no_sync does. fully_shard modules (fsdp, fsdp_tp) keep reducing every
micro-batch: without the sync each rank would hold the whole unsharded gradient until the last one
(FSDP2's no-sync accumulates it unsharded), and the planner counts their reduce-scatter per
micro-batch (plan/comm.py).

No CPU adaptation is needed here: FSDP2 (`fully_shard`) and DTensor tensor parallelism run on a
"cpu" device mesh with gloo as they are (shared/notes/cpu-strategies.md section 3 and 5); the
CUDA path is the same code with an NCCL "cuda" mesh, chosen by Lightning from the accelerator.
"""
from __future__ import annotations

import functools
from contextlib import contextmanager
from typing import Any, Iterator

from torch import nn

from scalelab.errors import ConfigError
from scalelab.strategies.base import RunSpec, StrategyPlan

#: precisions Lightning's ModelParallelStrategy accepts (its accelerator connector refuses 16-mixed)
PRECISIONS = ("32-true", "32", "bf16-mixed", "bf16-true")


def divisors(n: int) -> list[int]:
    return [d for d in range(1, n + 1) if n % d == 0]


@contextmanager
def replica_sync_off(module: nn.Module) -> Iterator[None]:
    """No gradient all-reduce by the FSDP2 `replicate` units inside `module` for the backward run
    within (their gradients accumulate locally; the next backward outside all-reduces the sum).
    Only replicate's: their gradients are whole on every rank anyway, so skipping costs no memory."""
    from torch.distributed._composable.replicate_with_fsdp import ReplicateModule

    replicas = [m for m in module.modules() if isinstance(m, ReplicateModule)]
    for m in replicas:
        m.set_requires_gradient_sync(False, recurse=False)
    try:
        yield
    finally:
        for m in replicas:
            m.set_requires_gradient_sync(True, recurse=False)


@functools.cache
def _mesh_strategy_class():
    """Lightning's ModelParallelStrategy with block_backward_sync for FSDP2's replicate (module
    docstring). Built on first use: importing Lightning costs ~2 s, which the launcher, validating
    plans before any rank starts, never pays."""
    from lightning.pytorch.strategies import ModelParallelStrategy

    class MeshParallelStrategy(ModelParallelStrategy):
        @contextmanager
        def block_backward_sync(self) -> Iterator[None]:
            # Lightning enters this around the forward and backward of every micro-batch but the
            # last of an accumulation (loops/optimization/automatic.py)
            with replica_sync_off(self.model):
                yield None

        def load_checkpoint(self, checkpoint_path: Any, weights_only: bool | None = None) -> dict[str, Any]:
            """tp at world 1 applies neither TP nor replicate (parallelize: meshes of 1): plain
            parameters, which Lightning's loader refuses ("Could not find a distributed model")
            for every checkpoint, the job's own included (a tp@1 baseline never resumed, requeued
            or restarted). Its code reads one all the same (get/set_model_state_dict and
            torch.distributed.checkpoint take plain modules): the refusal is lifted for this model."""
            from torch.distributed.tensor import DTensor

            if any(isinstance(p, DTensor) for p in self.model.parameters()):
                return super().load_checkpoint(checkpoint_path, weights_only)
            import lightning.fabric.strategies.model_parallel as fabric_mp

            guard = fabric_mp._has_dtensor_modules
            fabric_mp._has_dtensor_modules = lambda module: module is self.model or guard(module)
            try:
                return super().load_checkpoint(checkpoint_path, weights_only)
            finally:
                fabric_mp._has_dtensor_modules = guard

    return MeshParallelStrategy


class MeshParallelPlan(StrategyPlan):
    """A plan applied in configure_model on a (dp x tp) mesh. Subclasses set how many ranks
    form a tensor-parallel group (`tp_size`) and implement `parallelize`."""

    name = "mesh_parallel"
    meta_init = True  # parallelize() cuts the meta model; LitModule.configure_model materializes it

    def __init__(self, name: str | None = None, save_distributed_checkpoint: bool = True, **options: Any):
        super().__init__(name, **options)
        self.save_distributed_checkpoint = bool(save_distributed_checkpoint)
        self.precision = "32-true"  # set from the run in lightning_strategy (inside the rank)

    # -- degrees ---------------------------------------------------------------------------
    def tp_size(self, world_size: int) -> int:
        return 1

    def _degrees_or_raise(self, world_size: int) -> tuple[int, int]:
        tp = self.tp_size(world_size)
        if world_size % tp:
            raise ConfigError(f"strategy={self.name}: strategy.tensor_parallel_size={tp} does not divide the "
                              f"world size {world_size}: choose one of {', '.join(map(str, divisors(world_size)))}")
        return world_size // tp, tp

    def parallel_degrees(self, world_size: int) -> dict[str, int]:
        dp, tp = self._degrees_or_raise(world_size)
        return {"dp": dp, "tp": tp, "pp": 1}

    def dp_rank(self, global_rank: int, world_size: int) -> int:
        """The ranks of one tensor-parallel group (consecutive ranks, Lightning's mesh order
        (data_parallel, tensor_parallel)) must read the same samples: they share a dp rank."""
        return global_rank // self.tp_size(world_size)

    # -- preflight -------------------------------------------------------------------------
    def validate(self, run: RunSpec) -> None:
        super().validate(run)
        self._degrees_or_raise(run.world_size)
        if run.precision not in PRECISIONS:
            raise ConfigError(f"trainer.precision={run.precision} is not supported by strategy={self.name}: "
                              f"choose one of {', '.join(PRECISIONS)}")

    # -- inside a rank ---------------------------------------------------------------------
    def lightning_strategy(self, run: RunSpec):
        self.precision = run.precision  # parallelize() picks the FSDP2 mixed-precision policy from it
        dp, tp = self._degrees_or_raise(run.world_size)
        return _mesh_strategy_class()(data_parallel_size=dp, tensor_parallel_size=tp,
                                      save_distributed_checkpoint=self.save_distributed_checkpoint)

    def parallelize(self, net: nn.Module, device_mesh: Any) -> nn.Module:
        raise NotImplementedError

    # consolidated_state_dict: the base default (full_tensor() of every DTensor) is right here:
    # FSDP2 and parallelize_module keep the plain module's parameter names, so the keys are the
    # plain GPT's state_dict keys (checked by tests/integration/test_fsdp_tp.py).

"""`ddp`: torch DistributedDataParallel through Lightning (NCCL on GPU, gloo on CPU, chosen
by Lightning from the device), with its communication options:

- bucket_cap_mb: gradient bucket size (MB) DDP all-reduces as one message.
- comm_hook: how gradients are communicated
    none      plain fp32 all-reduce (the default; identical to Lightning's DDPStrategy)
    fp16      cast each bucket to float16, all-reduce, cast back (torch fp16_compress_hook)
    bf16      the same with bfloat16 (torch bf16_compress_hook; see gloo adaptation below)
    powersgd  low-rank PowerSGD compression (Vogels et al. 2019) with error feedback:
              powersgd_rank = matrix approximation rank, powersgd_start_iter = plain all-reduce
              steps before compression starts (torch needs >= 2)
- local_sgd_period: relaxed synchronization (post-local SGD, Lin et al. 2020). After
  local_sgd_start_step steps of ordinary DDP, gradients are no longer all-reduced: every rank
  steps its own replica on its own data, and parameters are averaged every local_sgd_period
  optimizer steps (torch post_localSGD_hook + PeriodicModelAverager, wired by Lightning's
  ddp_comm_state / model_averaging_period). Optimizer state (Adam moments, momentum) stays
  local to each rank, as in torch's implementation.

Named variants: conf/strategy/ddp_compress.yaml (bf16), ddp_powersgd.yaml, local_sgd.yaml.
"""
from __future__ import annotations

from typing import Any

import torch
import torch.distributed as dist

from scalelab.errors import ConfigError
from scalelab.strategies.base import RunSpec, StrategyPlan

COMM_HOOKS = ("none", "fp16", "bf16", "powersgd")


def bf16_compress_hook_any_backend(process_group, bucket):  # no annotations: see below
    """torch's bf16_compress_hook, under a name DDP accepts on gloo.

    Fixes: `TypeError: BF16 all reduce communication hook required CUDA 11+ and NCCL 2.10+`.
    DDP.register_comm_hook refuses any hook *named* bf16_compress_hook unless CUDA + NCCL >= 2.10
    are present, but gloo all-reduces bfloat16 tensors correctly (checked on torch 2.13 CPU).
    Same computation as torch's: cast the bucket to bf16, divide by the group size, all-reduce
    (sum), copy back into the fp32 bucket in place. Used only when the device is not CUDA; on
    CUDA torch's own hook is registered.
    (Unannotated on purpose: DDP compares the annotations with dist.GradBucket and
    torch.futures.Future[torch.Tensor], and `from __future__ import annotations` makes them strings.)"""
    group = process_group if process_group is not None else dist.group.WORLD
    buffer = bucket.buffer()
    compressed = buffer.to(torch.bfloat16).div_(group.size())

    def decompress(fut: torch.futures.Future) -> torch.Tensor:
        buffer.copy_(fut.value()[0])
        return buffer

    return dist.all_reduce(compressed, group=group, async_op=True).get_future().then(decompress)


class DDP(StrategyPlan):
    name = "ddp"
    replicates_model = True

    def __init__(self, name: str = "ddp", bucket_cap_mb: float = 25.0, find_unused_parameters: bool = False,
                 gradient_as_bucket_view: bool = True, static_graph: bool = False, comm_hook: str = "none",
                 powersgd_rank: int = 1, powersgd_start_iter: int = 2, local_sgd_period: int | None = None,
                 local_sgd_start_step: int = 0, **options):
        super().__init__(name, **options)
        if bucket_cap_mb is None or not bucket_cap_mb > 0:
            raise ConfigError(f"strategy.bucket_cap_mb={bucket_cap_mb!r} must be > 0 (MB per gradient bucket)")
        self.ddp_kwargs = dict(bucket_cap_mb=bucket_cap_mb, find_unused_parameters=find_unused_parameters,
                               gradient_as_bucket_view=gradient_as_bucket_view, static_graph=static_graph)
        comm_hook = "none" if comm_hook is None else str(comm_hook)
        if comm_hook not in COMM_HOOKS:
            raise ConfigError(f"strategy.comm_hook={comm_hook!r} is not known: choose one of {', '.join(COMM_HOOKS)}")
        if not isinstance(powersgd_rank, int) or powersgd_rank < 1:
            raise ConfigError(f"strategy.powersgd_rank={powersgd_rank!r} must be an integer >= 1")
        if not isinstance(powersgd_start_iter, int) or powersgd_start_iter < 2:
            raise ConfigError(f"strategy.powersgd_start_iter={powersgd_start_iter!r} must be an integer >= 2 "
                              "(PowerSGD with error feedback starts after at least 2 plain all-reduce steps)")
        if local_sgd_period is not None:
            if not isinstance(local_sgd_period, int) or local_sgd_period < 1:
                raise ConfigError(f"strategy.local_sgd_period={local_sgd_period!r} must be an integer >= 1 "
                                  "(optimizer steps between parameter averagings) or null (off)")
            if comm_hook != "none":
                raise ConfigError(f"strategy.comm_hook={comm_hook} cannot be combined with strategy.local_sgd_period "
                                  "(local SGD replaces the gradient all-reduce): set comm_hook=none")
        if not isinstance(local_sgd_start_step, int) or local_sgd_start_step < 0:
            raise ConfigError(f"strategy.local_sgd_start_step={local_sgd_start_step!r} must be an integer >= 0")
        self.comm_hook, self.powersgd_rank, self.powersgd_start_iter = comm_hook, powersgd_rank, powersgd_start_iter
        self.local_sgd_period, self.local_sgd_start_step = local_sgd_period, local_sgd_start_step

    def resume_note(self, world_size: int) -> str | None:
        # found by review: ddp_powersgd resumed at step 16 of 30 ended on 3.663, uninterrupted 3.520.
        # (The hook's step count and the averager's are set to the resumed step: CommHookDDPStrategy.)
        if self.local_sgd_period is not None:
            return ("local SGD: every rank resumes rank 0's replica and optimizer state (the checkpoint's), not "
                    "its own: the replicas after the resume are not the uninterrupted run's")
        if self.comm_hook == "powersgd":
            return ("PowerSGD: each rank's error feedback, low-rank memories and random state are not in the "
                    "checkpoint; compression goes on from the resumed step with none of them carried over, so the "
                    "loss after the resume is not the uninterrupted run's")
        return None

    def _hook_kwargs(self, run: RunSpec) -> dict[str, Any]:
        """ddp_comm_state / ddp_comm_hook / model_averaging_period for Lightning's DDPStrategy."""
        from torch.distributed.algorithms.ddp_comm_hooks import default_hooks, powerSGD_hook

        if self.local_sgd_period is not None:
            from torch.distributed.algorithms.ddp_comm_hooks import post_localSGD_hook as post

            # post_local_gradient_allreduce=False: after the start step no gradient is all-reduced
            # at all (plain local SGD). True would all-reduce within a node-local subgroup, which
            # torch builds from torch.cuda.device_count() (0 on CPU) and which on one node is
            # just DDP again.
            state = post.PostLocalSGDState(process_group=None, subgroup=None,
                                           start_localSGD_iter=self.local_sgd_start_step,
                                           post_local_gradient_allreduce=False)
            return dict(ddp_comm_state=state, ddp_comm_hook=post.post_localSGD_hook,
                        model_averaging_period=self.local_sgd_period)
        if self.comm_hook == "fp16":
            return dict(ddp_comm_hook=default_hooks.fp16_compress_hook)
        if self.comm_hook == "bf16":
            hook = default_hooks.bf16_compress_hook if run.accelerator == "gpu" else bf16_compress_hook_any_backend
            return dict(ddp_comm_hook=hook)
        if self.comm_hook == "powersgd":
            state = powerSGD_hook.PowerSGDState(process_group=None, matrix_approximation_rank=self.powersgd_rank,
                                               start_powerSGD_iter=self.powersgd_start_iter)
            return dict(ddp_comm_state=state, ddp_comm_hook=powerSGD_hook.powerSGD_hook)
        return {}

    def lightning_strategy(self, run: RunSpec):
        from lightning.pytorch.strategies import DDPStrategy

        from scalelab.strategies.ddp_lightning import CommHookDDPStrategy

        from scalelab.strategies.mapped_checkpoint_io import MappedCheckpointIO

        hooks = self._hook_kwargs(run)
        io = MappedCheckpointIO()   # a node's ranks share one mapped copy of the checkpoint on resume
        if not hooks:  # the default: Lightning's DDPStrategy
            return DDPStrategy(**self.ddp_kwargs, checkpoint_io=io)
        return CommHookDDPStrategy(**hooks, **self.ddp_kwargs, checkpoint_io=io)

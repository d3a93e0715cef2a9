"""Deliberately broken strategies, for tests only: each one gets a gradient's scale wrong in a way
that a scale-invariant optimizer (Adam/AdamW) cannot see, so the equivalence tests, which train
with SGD (linear in the gradient), must tell them from the real strategy.

Selected with a Hydra override of the strategy's class, keeping the strategy's name and options:
    strategy=ddp      strategy._target_=tests.mutations.SummingDDP
    strategy=pipeline strategy._target_=tests.mutations.UnscaledPipeline
The launcher's processes (Hydra app and ranks) import this module: tests/conftest.py env() puts the
repository root on PYTHONPATH.
"""
import torch.distributed as dist

from scalelab.strategies.ddp import DDP
from scalelab.strategies.ddp_lightning import CommHookDDPStrategy
from scalelab.strategies.pipeline import Pipeline


def allreduce_sum_hook(process_group, bucket):  # unannotated: DDP checks hook annotations
    """DDP's all-reduce WITHOUT the division by the world size: every rank steps with the SUM of
    the ranks' gradients, world_size times the mean gradient that one device computes."""
    group = process_group if process_group is not None else dist.group.WORLD
    fut = dist.all_reduce(bucket.buffer(), group=group, async_op=True).get_future()
    return fut.then(lambda f: f.value()[0])


class SummingDDP(DDP):
    """`ddp` whose gradient all-reduce sums instead of averaging (a missing 1/world_size)."""

    def lightning_strategy(self, run):
        return CommHookDDPStrategy(ddp_comm_hook=allreduce_sum_hook, **self.ddp_kwargs)


class UnscaledPipeline(Pipeline):
    """`pipeline` whose schedule does not divide the micro-batches' summed gradients by their
    number m (scale_grads=False with a mean loss per micro-batch): m times the right gradient."""

    def _build_schedule(self, pl_module) -> None:
        super()._build_schedule(pl_module)
        self._schedule.scale_grads = False


class HangingDDP(DDP):
    """`ddp` whose rank 1 stops answering at step 3 (a hung process: alive, in no collective), so
    rank 0 waits in the gradient all-reduce until trainer.collective_timeout_s ends it."""

    def lightning_strategy(self, run):
        import time

        from lightning.pytorch.strategies import DDPStrategy

        class _Hang(DDPStrategy):
            def training_step(self, *args, **kwargs):
                if self.global_rank == 1 and self.lightning_module.trainer.global_step == 3:
                    time.sleep(600)
                return super().training_step(*args, **kwargs)

        return _Hang(**self.ddp_kwargs)

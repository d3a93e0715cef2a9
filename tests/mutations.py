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


class KilledInSaveDDP(DDP):
    """`ddp` under torchrun whose rank 1 is SIGKILLed inside the periodic checkpoint save at step
    10 of the first attempt (its first barrier: rank 0 is writing the checkpoint), and whose
    restarted rank 0 joins the process group 6 s late (a rank slowed by its imports, W&B or a
    loaded host). The restarted rank 1, first at the rendezvous, fails where the store it is about
    to use still holds keys (rank 0 has written none yet: the failed attempt's, its dead peer's
    gloo address among them). The real restart failed on those about every other time (whether
    the rank that read the stale address was the one to connect); this makes it every time."""

    def lightning_strategy(self, run):
        import os
        import signal
        import time
        from datetime import timedelta

        from lightning.pytorch.strategies import DDPStrategy

        attempt = int(os.environ.get("TORCHELASTIC_RESTART_COUNT") or 0)

        class _KilledInSave(DDPStrategy):
            def setup_environment(self):
                if attempt > 0 and os.environ.get("RANK") == "0":
                    time.sleep(6)
                if attempt > 0 and os.environ.get("RANK") == "1" and \
                        os.environ.get("TORCHELASTIC_USE_AGENT_STORE") == "True":
                    store = dist.TCPStore(os.environ["MASTER_ADDR"], int(os.environ["MASTER_PORT"]), is_master=False,
                                          timeout=timedelta(seconds=10))
                    if store.num_keys():
                        raise RuntimeError(f"restart {attempt}: the rendezvous store already holds {store.num_keys()} "
                                           "key(s) before rank 0 joined: the failed attempt's")
                super().setup_environment()

            def barrier(self, *args, **kwargs):
                trainer = self.lightning_module.trainer if self.lightning_module is not None else None
                if attempt == 0 and self.global_rank == 1 and trainer is not None and trainer.global_step == 10:
                    os.kill(os.getpid(), signal.SIGKILL)
                return super().barrier(*args, **kwargs)

        return _KilledInSave(**self.ddp_kwargs)

"""`single`: no parallelism wrapper.

At world size 1 it is plain one-device training (the baseline of every scaling figure).
At world size N > 1 it runs N independent replicas, each on its own data-parallel shard,
with no gradient communication: the communication-free upper bound on data-parallel
throughput (what DDP would reach if all-reduce were free). Its loss curve is the mean of the
replicas', so it is NOT equivalent to one model trained on the global batch.
"""
from __future__ import annotations

from scalelab.strategies.base import RunSpec, StrategyPlan


class Single(StrategyPlan):
    name = "single"
    replicates_model = True
    independent_replicas = True

    def resume_note(self, world_size: int) -> str | None:
        if world_size > 1:   # the checkpoint is rank 0's (IndependentReplicasStrategy)
            return ("single on several ranks: every replica resumes rank 0's parameters and optimizer state (the "
                    "checkpoint's), not its own: the replicas after the resume are not the uninterrupted run's")
        return None

    def lightning_strategy(self, run: RunSpec):
        from lightning.pytorch.strategies import SingleDeviceStrategy

        from scalelab.strategies.ddp_lightning import IndependentReplicasStrategy
        from scalelab.strategies.mapped_checkpoint_io import MappedCheckpointIO

        if run.world_size == 1:
            import torch

            device = torch.device("cuda", 0) if run.accelerator == "gpu" else torch.device("cpu")
            return SingleDeviceStrategy(device=device, checkpoint_io=MappedCheckpointIO())
        return IndependentReplicasStrategy(checkpoint_io=MappedCheckpointIO())

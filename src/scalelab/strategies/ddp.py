"""`ddp`: torch DistributedDataParallel through Lightning (NCCL on GPU, gloo on CPU, chosen
by Lightning from the device)."""
from __future__ import annotations

from lightning.pytorch.strategies import DDPStrategy

from scalelab.strategies.base import RunSpec, StrategyPlan


class DDP(StrategyPlan):
    name = "ddp"

    def __init__(self, name: str = "ddp", bucket_cap_mb: float = 25.0, find_unused_parameters: bool = False,
                 gradient_as_bucket_view: bool = True, static_graph: bool = False, **options):
        super().__init__(name, **options)
        self.ddp_kwargs = dict(bucket_cap_mb=bucket_cap_mb, find_unused_parameters=find_unused_parameters,
                               gradient_as_bucket_view=gradient_as_bucket_view, static_graph=static_graph)

    def lightning_strategy(self, run: RunSpec):
        return DDPStrategy(**self.ddp_kwargs)

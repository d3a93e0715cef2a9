"""The Lightning strategy class behind `nd` (nd.py holds the plan; apart because importing
Lightning costs ~2 s and the launcher validates plans without it)."""
from __future__ import annotations

from scalelab.strategies.pipeline_lightning import PipelineStrategy


class NDStrategy(PipelineStrategy):
    """The pipeline's Lightning strategy as is: DDPStrategy's process group and launch with no DDP
    wrapper (FSDP2 and TP are applied by the plan in configure_model, on its own 3-D mesh), manual
    optimization (the schedule runs forward and backward), and checkpoints as a
    torch.distributed.checkpoint folder: every rank writes its stage's DTensor shards and
    optimizer state under the plain GPT's names (DCP de-duplicates the shards TP peers replicate),
    rank 0 adds meta.pt (loops, schedulers, step, and the layout: stages, tp, dp)."""

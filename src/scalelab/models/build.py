"""The plain nn.Module a model config describes. Apart from lit.py so that what only needs the
model (the planner's exact parameter count on the meta device: plan_job.py) does not import
Lightning (~1.5 s of `scalelab plan OVERRIDES`'s start)."""
from __future__ import annotations

from typing import Any

from torch import nn


def build_net(arch: Any) -> nn.Module:
    from scalelab.models.gpt import GPT, GPTConfig
    from scalelab.models.mlp import MLPClassifier, MLPConfig

    if isinstance(arch, GPTConfig):
        return GPT(arch)
    if isinstance(arch, MLPConfig):
        return MLPClassifier(arch)
    raise TypeError(f"no model for config {type(arch).__name__}")

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


def count_parameters(arch: Any) -> int:
    """The model's exact parameter count, allocating nothing: built on the meta device, with
    torch.nn.init skipped (a meta tensor has no values to fill, and the meta path of
    init.normal_ is wrapped by torch._disable_dynamo, whose first call imports torch._dynamo:
    ~2 s of CPU in `scalelab plan OVERRIDES`, which never compiles)."""
    import torch
    from torch.overrides import TorchFunctionMode

    class SkipInit(TorchFunctionMode):
        def __torch_function__(self, func, types, args=(), kwargs=None):
            if getattr(func, "__module__", None) == "torch.nn.init":  # init.X_(tensor, ...): unchanged
                return args[0] if args else (kwargs or {})["tensor"]
            return func(*args, **(kwargs or {}))

    with torch.device("meta"), SkipInit():
        return sum(p.numel() for p in build_net(arch).parameters())

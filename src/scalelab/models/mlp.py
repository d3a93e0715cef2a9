"""A small MLP classifier as a plain nn.Module (no notion of ranks)."""
from __future__ import annotations

from dataclasses import dataclass, field

import torch
from torch import nn


@dataclass
class MLPConfig:
    in_features: int = 64
    hidden: list[int] = field(default_factory=lambda: [256, 256])
    num_classes: int = 10


def mlp_params(cfg: MLPConfig) -> int:
    """Weights and biases of every Linear, from the config (not from live, possibly sharded tensors)."""
    dims = [cfg.in_features, *cfg.hidden, cfg.num_classes]
    return sum(a * b + b for a, b in zip(dims, dims[1:]))


class MLPClassifier(nn.Module):
    def __init__(self, cfg: MLPConfig):
        super().__init__()
        self.cfg = cfg
        dims = [cfg.in_features, *cfg.hidden]
        layers: list[nn.Module] = []
        for a, b in zip(dims, dims[1:]):
            layers += [nn.Linear(a, b), nn.GELU()]
        layers.append(nn.Linear(dims[-1], cfg.num_classes))
        self.net = nn.Sequential(*layers)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.net(x)

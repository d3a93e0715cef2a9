"""Global batch size is the input; per-device micro-batch and accumulation are derived.

global_batch = dp_size x micro_batch x accumulate_grad_batches
"""
from __future__ import annotations

from dataclasses import dataclass

from scalelab.errors import ConfigError


@dataclass(frozen=True)
class BatchPlan:
    global_batch_size: int
    per_device_batch_size: int
    accumulate_grad_batches: int
    dp_size: int


def derive_batch(global_batch: int, dp_size: int, micro_batch: int | None = None) -> BatchPlan:
    """micro_batch None -> as large as possible without accumulation (global / dp_size)."""
    if global_batch < 1:
        raise ConfigError(f"data.global_batch_size={global_batch} must be >= 1")
    if micro_batch is None:
        if global_batch % dp_size:
            raise ConfigError(
                f"data.global_batch_size={global_batch} does not divide by {dp_size} data-parallel "
                f"ranks: use a multiple of {dp_size}")
        micro_batch = global_batch // dp_size
    if micro_batch < 1:
        raise ConfigError(f"data.micro_batch_size={micro_batch} must be >= 1 (or null to derive it)")
    if global_batch % (dp_size * micro_batch):
        raise ConfigError(
            f"data.global_batch_size={global_batch} does not divide by {dp_size} data-parallel ranks x "
            f"micro batch {micro_batch} = {dp_size * micro_batch}: use a multiple of "
            f"{dp_size * micro_batch} or another data.micro_batch_size")
    return BatchPlan(global_batch, micro_batch, global_batch // (dp_size * micro_batch), dp_size)

"""trainer.collective_timeout_s for every process group of a rank, not only the default one.

Fixes (found by review): the worker gave the timeout to Lightning's init_process_group, i.e. the
default group only. torch's DeviceMesh creates its sub-groups with timeout=None, which is torch's
default (NCCL 10 min, gloo 30 min; torch 2.13 distributed_c10d._get_default_timeout), and so does
`dist.new_group()`: Lightning's (data_parallel, tensor_parallel) mesh under tp / fsdp_tp measured
60 s on the default group and 1800 s on its tensor_parallel group (2 gloo ranks, dp 2 x tp 1).
A job set to fail after 60 s waited up to 30 min on a hung TP, PP or DP peer.

Each place that makes groups gives them the default group's timeout, read from that group (it is
the job's trainer.collective_timeout_s, which the worker hands to Lightning's init_process_group),
so no plan needs the setting passed to it: `with_collective_timeout` for Lightning's mesh,
`like_default` where a plan builds its own mesh (pipeline, nd), `default_timeout()` for
`new_group(timeout=...)` (the requeue flag's gloo group).
"""
from __future__ import annotations

from datetime import timedelta
from typing import Any

import torch.distributed as dist


def default_timeout() -> timedelta | None:
    """The default process group's timeout (None: no group, or a backend that does not say)."""
    world = dist.group.WORLD if dist.is_available() and dist.is_initialized() else None
    if world is None:
        return None
    for device in world._device_types:   # gloo and NCCL backends both keep it in their options
        timeout = getattr(getattr(world._get_backend(device), "options", None), "_timeout", None)
        if timeout is not None:
            return timeout
    return None


def _groups(holder: Any) -> list:
    if holder is None:
        return []
    if hasattr(holder, "get_all_groups"):   # a DeviceMesh: one group per dimension
        return list(holder.get_all_groups())
    return [holder]


def like_default(*holders: Any) -> None:
    """Give every group of these device meshes / process groups (None: skipped) the default
    group's timeout. `_set_pg_timeout` (as torchtitan's set_pg_timeouts) sets the backend's
    default timeout, which every later collective on that group uses (gloo and NCCL alike)."""
    timeout = default_timeout()
    if timeout is None:
        return
    from torch.distributed.distributed_c10d import _rank_not_in_group, _set_pg_timeout

    for holder in holders:
        for group in _groups(holder):
            if not _rank_not_in_group(group):
                _set_pg_timeout(timeout, group)


def with_collective_timeout(strategy: Any, seconds: float) -> Any:
    """The Lightning strategy with `seconds` as its process groups' timeout: the default group's
    (Lightning passes `_timeout` to init_process_group; its own default is 30 min) and that of the
    device mesh ModelParallelStrategy builds right after it in setup_environment (fsdp, tp,
    fsdp_tp), before any collective runs on the mesh. A registry name passes through as is."""
    if isinstance(strategy, str) or not hasattr(strategy, "setup_environment"):
        return strategy
    if hasattr(strategy, "_timeout"):
        strategy._timeout = timedelta(seconds=float(seconds))
    inner = strategy.setup_environment

    def setup_environment() -> None:
        inner()
        like_default(getattr(strategy, "_device_mesh", None))

    strategy.setup_environment = setup_environment
    return strategy

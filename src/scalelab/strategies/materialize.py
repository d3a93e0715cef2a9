"""Meta-device init for the strategies that cut the model (FSDP, TP, fsdp_tp, nd, pipeline).

Issue 11 measured a 1.2B GPT under fsdp / tp at 5.6 GiB of host RSS per rank: each rank built the
whole fp32 model on the host, then kept its shard. Now such a rank builds the plain model on the
meta device (shapes, no storage: `StrategyPlan.init_device`), the strategy cuts it (trims a
pipeline stage, applies TP styles, fully_shard) while it is still storage-free, and
`materialize` (called by LitModule.configure_model right after the cut) then allocates only
this rank's part, on its own device, and fills it from the
model's own per-parameter init (`GPT.fill_initial`): one full parameter at a time is drawn on the
device, and this rank keeps its shard of it (torchtitan's order: meta -> parallelize ->
to_empty -> init_weights). Because every parameter draws from its own seeded generator, the
result equals `single`'s weights on the same device type: tests/integration/meta_init_probe.py
compares every shard with an eagerly built GPT.

Models without `fill_initial` (the MLP classifier) are built on the host as before.
"""
from __future__ import annotations

from typing import Any

import torch
from torch import nn


def supports_meta_init(arch: Any) -> bool:
    """True for model configs whose model can fill any parameter by name (GPT)."""
    from scalelab.models.gpt import GPTConfig

    return isinstance(arch, GPTConfig)


def is_meta(net: nn.Module) -> bool:
    return any(p.is_meta for p in net.parameters())


@torch.no_grad()
def materialize(net: nn.Module, device: torch.device) -> nn.Module:
    """Allocate the (already cut) meta-device `net` on `device` and write its initial values;
    a model that holds real tensors is returned unchanged. Each full parameter is drawn on
    `device` (the largest one is the peak: for a 1.2B GPT, one 2048 x 8192 MLP matrix), and a
    DTensor keeps its own shard of it: `distribute_tensor(..., src_data_rank=None)` slices the
    identical full value every rank drew, with no communication."""
    if not is_meta(net):
        return net
    from torch.distributed.tensor import DTensor, distribute_tensor

    buffers = [n for n, _ in net.named_buffers()]
    if buffers:  # GPT has none; a model that gains one must say how to fill it
        raise RuntimeError(f"materialize: no initial value for buffer(s) {buffers}")
    net.to_empty(device=device)   # FSDP2 re-points its sharded parameters (FSDPModule._apply)
    for name, p in net.named_parameters():
        full = torch.empty(p.shape, dtype=p.dtype, device=device)
        net.fill_initial(name, full)
        if isinstance(p, DTensor):
            full = distribute_tensor(full, p.device_mesh, p.placements, src_data_rank=None)
        p.copy_(full)
    return net

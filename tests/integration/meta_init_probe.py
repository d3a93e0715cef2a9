"""One rank of the meta-device init probe (tests/integration/test_meta_init.py), started by torchrun
with 4 gloo ranks. Not a test module itself: it writes one JSON file per rank.

For each layout, the rank builds the GPT on the meta device (as the worker does for these
strategies), cuts it with the strategy's own code, materializes it (strategies/materialize.py),
and compares every parameter it holds with the same slice of a GPT built eagerly on the host
with the same seed (plain PyTorch, the reference `single` uses). It also reports whether any
parameter was still on the meta device after the cut and before materialize (nothing allocated
until then) and the bytes this rank's parameters hold.
"""
from __future__ import annotations

import json
import os
import sys

import torch
import torch.distributed as dist


def _local(t):
    return t.to_local() if hasattr(t, "to_local") else t


def _compare(model, ref) -> dict:
    """Largest |difference| of every full parameter (gathered) against the eager model, and this
    rank's local bytes."""
    want = dict(ref.named_parameters())
    worst, names, local = 0.0, [], 0
    for name, p in model.named_parameters():
        full = p.full_tensor() if hasattr(p, "full_tensor") else p
        worst = max(worst, (full.detach() - want[name].detach()).abs().max().item())
        names.append(name)
        local += _local(p).numel() * _local(p).element_size()
    return {"max_abs_diff": worst, "names": sorted(names), "local_bytes": local,
            "devices": sorted({_local(p).device.type for p in model.parameters()})}


def main(out: str) -> None:
    from torch.distributed.device_mesh import init_device_mesh

    from scalelab.models.gpt import GPT, GPTConfig
    from scalelab.strategies.fsdp import apply_fsdp
    from scalelab.strategies.materialize import is_meta, materialize
    from scalelab.strategies.pipeline_split import make_stage
    from scalelab.strategies.tensor_parallel import apply_tensor_parallel

    dist.init_process_group("gloo")
    torch.set_num_threads(1)
    world, rank = dist.get_world_size(), dist.get_rank()
    # d_model 72 over 4 ranks: FSDP's dim-0 shards of the 72-row matrices are even, the 256-row
    # embedding even, but ln (72,) and pos_emb (40 rows) over 4 are not all the same size.
    cfg = GPTConfig(n_layers=4, n_heads=4, d_model=72, seq_len=40, vocab_size=256, mlp_ratio=4)
    torch.manual_seed(1234)
    ref = GPT(cfg)

    def meta_gpt():
        torch.manual_seed(1234)  # the worker seeds before building, as for the eager reference
        with torch.device("meta"):
            return GPT(cfg)

    result = {}
    cpu = torch.device("cpu")
    mesh1 = init_device_mesh("cpu", (world,))
    # fsdp over all 4 ranks
    net = apply_fsdp(meta_gpt(), mesh1, "32-true")
    meta_before = is_meta(net)
    result["fsdp"] = {**_compare(materialize(net, cpu), ref), "meta_before": meta_before}
    # tp over all 4 ranks (vocab-parallel embedding, colwise/rowwise, replicated LayerNorms)
    net = apply_tensor_parallel(meta_gpt(), mesh1, sequence_parallel=True)
    meta_before = is_meta(net)
    result["tp"] = {**_compare(materialize(net, cpu), ref), "meta_before": meta_before}
    # fsdp_tp: 2 (dp) x 2 (tp); FSDP shards the TP shards again along dim 0 (strided shards)
    mesh2 = init_device_mesh("cpu", (2, 2), mesh_dim_names=("dp", "tp"))
    net = apply_tensor_parallel(meta_gpt(), mesh2["tp"])
    net = apply_fsdp(net, mesh2["dp"], "32-true")
    meta_before = is_meta(net)
    result["fsdp_tp"] = {**_compare(materialize(net, cpu), ref), "meta_before": meta_before}
    # a pipeline stage: rank r keeps layer r only (4 stages of 1 layer), plain tensors
    net = make_stage(meta_gpt(), rank, world, [1] * world, 1)
    meta_before = is_meta(net)
    result["pipeline"] = {**_compare(materialize(net, cpu), ref), "meta_before": meta_before}
    with open(os.path.join(out, f"rank{rank}.json"), "w") as f:
        json.dump(result, f)
    dist.barrier()
    dist.destroy_process_group()


if __name__ == "__main__":
    main(sys.argv[1])

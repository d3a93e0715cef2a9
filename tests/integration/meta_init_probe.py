"""One rank of the meta-device init probe (tests/integration/test_meta_init.py), started by torchrun
with 4 gloo ranks. Not a test module itself: it writes one JSON file per rank.

For each layout, the rank builds the GPT on the meta device (as the worker does for these
strategies), cuts it with the strategy's own code, materializes it (strategies/materialize.py),
and compares every parameter it holds with the same slice of a GPT built eagerly on the host
with the same seed (plain PyTorch, the reference `single` uses). It also reports whether any
parameter was still on the meta device after the cut and before materialize (nothing allocated
until then) and the bytes this rank's parameters hold; once for a GPT whose every dimension divides
by 4 and once with a vocabulary and context that do not (uneven shards).
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
    from scalelab.strategies.materialize import materialize
    from scalelab.strategies.pipeline_split import make_stage
    from scalelab.strategies.tensor_parallel import apply_tensor_parallel

    dist.init_process_group("gloo")
    torch.set_num_threads(1)
    world, rank = dist.get_world_size(), dist.get_rank()
    result = {}
    cpu = torch.device("cpu")
    mesh1 = init_device_mesh("cpu", (world,))
    mesh2 = init_device_mesh("cpu", (2, 2), mesh_dim_names=("dp", "tp"))
    # "even": every dim 0 (256, 40, 72, 288) divides by 4 (the test's hand counts of bytes per rank);
    # "uneven": vocabulary 250 and context 38 give shards of 63/63/63/61 and 10/10/10/8 rows
    for shape, vocab, seq in (("even", 256, 40), ("uneven", 250, 38)):
        cfg = GPTConfig(n_layers=4, n_heads=4, d_model=72, seq_len=seq, vocab_size=vocab, mlp_ratio=4)
        torch.manual_seed(1234)
        ref = GPT(cfg)

        def meta_gpt():
            torch.manual_seed(1234)  # the worker seeds before building, as for the eager reference
            with torch.device("meta"):
                return GPT(cfg)

        def check(name, net):
            untouched = all(p.is_meta for p in net.parameters())   # nothing allocated before materialize
            result[f"{name}@{shape}"] = {**_compare(materialize(net, cpu), ref), "meta_before": untouched}

        check("fsdp", apply_fsdp(meta_gpt(), mesh1, "32-true"))                       # fsdp over 4
        check("tp", apply_tensor_parallel(meta_gpt(), mesh1, sequence_parallel=True))  # tp over 4, + SP
        # fsdp_tp: 2 (dp) x 2 (tp); FSDP shards the TP shards again along dim 0 (strided shards)
        check("fsdp_tp", apply_fsdp(apply_tensor_parallel(meta_gpt(), mesh2["tp"]), mesh2["dp"], "32-true"))
        # a pipeline stage: rank r keeps layer r only (4 stages of 1 layer), plain tensors
        check("pipeline", make_stage(meta_gpt(), rank, world, [1] * world, 1))
    with open(os.path.join(out, f"rank{rank}.json"), "w") as f:
        json.dump(result, f)
    dist.barrier()
    dist.destroy_process_group()


if __name__ == "__main__":
    main(sys.argv[1])

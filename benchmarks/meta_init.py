"""Host memory of building a sharded GPT: eager (the whole fp32 model on every rank, then cut) vs
meta-device init (strategies/materialize.py: cut the storage-free model, allocate the shard).

    .venv/bin/python benchmarks/meta_init.py [--layers 24 --width 2048 --heads 16 --ranks 2 --strategy fsdp]

Defaults: the issue-11 1.2B GPT (24 x 2048, context 1024) under FSDP2 on 2 gloo ranks
(`--strategy tp`, `--strategy zero3`: DeepSpeed's zero.Init as ScaleLab's ZeRO-3 uses it; the eager
zero3 row is the host-built model deepspeed.initialize would then partition). Each mode
runs in fresh torchrun processes; each rank reports its peak RSS (getrusage ru_maxrss, the
process's high-water mark) before building and after the model is built, cut and filled, plus the
bytes of parameters it holds. On a GPU host the same code fills the shard on the device, so the
host figure is what the "meta" row minus the shard would be; here (CPU) the shard lives in host
memory, which is the floor.
"""
from __future__ import annotations

import argparse
import json
import os
import resource
import subprocess
import sys
import tempfile
from pathlib import Path


def _peak_mib() -> float:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024  # Linux: KiB


def rank_main(mode: str, strategy: str, layers: int, width: int, heads: int, out: str) -> None:
    import torch
    import torch.distributed as dist
    from torch.distributed.device_mesh import init_device_mesh

    from scalelab.models.gpt import GPT, GPTConfig
    from scalelab.strategies.fsdp import apply_fsdp
    from scalelab.strategies.materialize import materialize
    from scalelab.strategies.tensor_parallel import apply_tensor_parallel

    dist.init_process_group("gloo")
    torch.set_num_threads(1)
    mesh = init_device_mesh("cpu", (dist.get_world_size(),))
    cfg = GPTConfig(n_layers=layers, n_heads=heads, d_model=width, seq_len=1024, vocab_size=256)
    if strategy == "zero3":
        import deepspeed  # imported before the baseline: its code is not the model's
    before = _peak_mib()
    torch.manual_seed(0)
    with torch.device("meta" if mode == "meta" else "cpu"):
        net = GPT(cfg)
    if strategy == "zero3":  # eager: deepspeed.initialize would partition the host-built model
        if mode == "meta":   # ScaleLab's path: ZeRO.parallelize under zero.Init
            from scalelab.strategies.deepspeed import ZeRO

            with deepspeed.zero.Init(config_dict_or_path={"zero_optimization": {"stage": 3},
                                                          "train_micro_batch_size_per_gpu": 1}):
                net = ZeRO(stage=3).parallelize(net, None)
        held = sum(p.ds_tensor.numel() * p.ds_tensor.element_size() for p in net.parameters()) \
            if mode == "meta" else sum(p.numel() * 4 for p in net.parameters())
    else:
        net = apply_fsdp(net, mesh, "32-true") if strategy == "fsdp" else apply_tensor_parallel(net, mesh)
        net = materialize(net, torch.device("cpu"))
        held = sum((p.to_local() if hasattr(p, "to_local") else p).numel() * 4 for p in net.parameters())
    row = {"rank": dist.get_rank(), "before_mib": before, "after_mib": _peak_mib(), "held_mib": held / 2**20,
           "params": sum(p.numel() for p in net.parameters())}
    Path(out, f"{mode}{dist.get_rank()}.json").write_text(json.dumps(row))
    dist.barrier()
    dist.destroy_process_group()


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--layers", type=int, default=24)
    ap.add_argument("--width", type=int, default=2048)
    ap.add_argument("--heads", type=int, default=16)
    ap.add_argument("--ranks", type=int, default=2)
    ap.add_argument("--strategy", choices=["fsdp", "tp", "zero3"], default="fsdp")
    ap.add_argument("--rank-mode", help=argparse.SUPPRESS)
    ap.add_argument("--out", help=argparse.SUPPRESS)
    a = ap.parse_args()
    if a.rank_mode:
        return rank_main(a.rank_mode, a.strategy, a.layers, a.width, a.heads, a.out)
    out = tempfile.mkdtemp(prefix="meta_init_")
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONPATH": str(Path(__file__).resolve().parents[1] / "src"),
           **({"DS_ACCELERATOR": "cpu"} if a.strategy == "zero3" else {})}
    for mode in ("eager", "meta"):
        subprocess.run([sys.executable, "-m", "torch.distributed.run", "--standalone", f"--nproc_per_node={a.ranks}",
                        __file__, "--rank-mode", mode, "--out", out, "--strategy", a.strategy, "--layers",
                        str(a.layers), "--width", str(a.width), "--heads", str(a.heads)], env=env, check=True)
    print(f"GPT {a.layers} x {a.width}, {a.strategy} over {a.ranks} gloo ranks; peak RSS per rank "
          f"(ru_maxrss) before building and after build + cut + fill:")
    print(f"{'mode':6} {'rank':>4} {'before MiB':>11} {'after MiB':>10} {'growth MiB':>11} {'params held MiB':>16}")
    for mode in ("eager", "meta"):
        for r in range(a.ranks):
            row = json.loads(Path(out, f"{mode}{r}.json").read_text())
            print(f"{mode:6} {r:>4} {row['before_mib']:>11.0f} {row['after_mib']:>10.0f} "
                  f"{row['after_mib'] - row['before_mib']:>11.0f} {row['held_mib']:>16.0f}")


if __name__ == "__main__":
    main()

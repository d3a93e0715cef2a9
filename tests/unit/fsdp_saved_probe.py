"""Saved-tensor bytes of scalelab's GPT under FSDP2's bf16-mixed policy (strategies.fsdp.apply_fsdp)
with Lightning's CPU autocast on top, one gloo rank: `python fsdp_saved_probe.py PG_FILE L h a s b ...`
prints one JSON list of bytes (test_plan_saved_tensors.py; a process of its own: a process group)."""
import json
import sys

import torch
import torch.distributed as dist

from scalelab.models.gpt import GPT, GPTConfig
from scalelab.strategies.fsdp import apply_fsdp


def fsdp_saved_bytes(cfg: GPTConfig, batch: int, mesh) -> int:
    from tests.unit.test_plan_saved_tensors import saved_bytes

    torch.manual_seed(0)
    model = apply_fsdp(GPT(cfg).train(), mesh, "bf16-mixed")
    tokens = torch.randint(0, cfg.vocab_size, (batch, cfg.seq_len + 1))
    return saved_bytes(model, tokens, torch.autocast("cpu", dtype=torch.bfloat16))


if __name__ == "__main__":
    from torch.distributed.device_mesh import init_device_mesh

    dist.init_process_group("gloo", init_method=f"file://{sys.argv[1]}", rank=0, world_size=1)
    mesh = init_device_mesh("cpu", (1,))
    vals = list(map(int, sys.argv[2:]))
    out = []
    for L, h, a, s, b in zip(*[iter(vals)] * 5):
        cfg = GPTConfig(n_layers=L, d_model=h, n_heads=a, seq_len=s, vocab_size=256, mlp_ratio=4, dropout=0.0)
        out.append(fsdp_saved_bytes(cfg, b, mesh))
    print(json.dumps(out))
    dist.destroy_process_group()

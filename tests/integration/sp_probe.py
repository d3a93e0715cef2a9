"""One rank of the sequence-parallel probe (tests/integration/test_sequence_parallel.py), started
by torchrun with 2 gloo ranks. Not a test module itself: it writes one JSON file per rank.

Per rank, for sequence_parallel false and true:
1. gradients: the TP-sharded GPT (tensor_parallel.apply_tensor_parallel) and an unsharded copy of
   the same seeded GPT run one forward + backward on the same batch; the largest difference of
   loss and gradients (DTensors gathered with full_tensor) is reported. The reference is plain
   PyTorch on one process, not the code under test.
2. activation bytes: one forward of the sharded model under saved_tensors_hooks, summing each
   saved storage once (a DTensor by its local tensor's storage: what this rank holds), parameters
   and tensors computed from a parameter alone excluded (as tests/unit/test_plan_saved_tensors.py).
   Bytes saved while a Block's forward runs are also summed apart ("blocks").
"""
from __future__ import annotations

import json
import os
import sys

import torch
import torch.distributed as dist
import torch.nn.functional as F

from tests.unit.test_plan_saved_tensors import _from_parameter  # the same exclusion rule


def _local(t: torch.Tensor) -> torch.Tensor:
    return getattr(t, "_local_tensor", t)


def saved_bytes(model, tokens) -> dict:
    from scalelab.models.gpt import Block

    params = {_local(p).untyped_storage().data_ptr() for p in model.parameters()}
    seen: dict[int, int] = {}
    inside = [0]
    blocks = [0]

    def pack(t):
        lt = _local(t)
        key = lt.untyped_storage().data_ptr()
        if key not in params and key not in seen and not _from_parameter(t):
            seen[key] = lt.untyped_storage().nbytes()
            if inside[0]:
                blocks[0] += seen[key]
        return t

    hooks = []
    for m in model.modules():
        if isinstance(m, Block):
            hooks.append(m.register_forward_pre_hook(lambda *a: inside.__setitem__(0, 1)))
            hooks.append(m.register_forward_hook(lambda *a: inside.__setitem__(0, 0)))
    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        logits = model(tokens[:, :-1])
        loss = F.cross_entropy(logits.float().reshape(-1, logits.shape[-1]), tokens[:, 1:].reshape(-1))
    loss.backward()
    for h in hooks:
        h.remove()
    return {"total": sum(seen.values()), "blocks": blocks[0]}


def main(out: str, layers: int, d: int, heads: int, seq: int, batch: int) -> None:
    from torch.distributed.device_mesh import init_device_mesh

    from scalelab.models.gpt import GPT, GPTConfig
    from scalelab.strategies.tensor_parallel import apply_tensor_parallel

    dist.init_process_group("gloo")
    torch.set_num_threads(1)
    mesh = init_device_mesh("cpu", (dist.get_world_size(),))
    cfg = GPTConfig(n_layers=layers, n_heads=heads, d_model=d, seq_len=seq, vocab_size=256, mlp_ratio=4)
    g = torch.Generator().manual_seed(1)
    tokens = torch.randint(0, cfg.vocab_size, (batch, seq + 1), generator=g)
    result = {}
    for sp in (False, True):
        torch.manual_seed(0)
        ref = GPT(cfg)
        torch.manual_seed(0)
        model = apply_tensor_parallel(GPT(cfg), mesh, sequence_parallel=sp)
        ref_loss = F.cross_entropy(ref(tokens[:, :-1]).reshape(-1, 256), tokens[:, 1:].reshape(-1))
        ref_loss.backward()
        loss = F.cross_entropy(model(tokens[:, :-1]).float().reshape(-1, 256), tokens[:, 1:].reshape(-1))
        loss.backward()
        grads = dict(ref.named_parameters())
        worst = 0.0
        for name, p in model.named_parameters():
            got = p.grad.full_tensor() if hasattr(p.grad, "full_tensor") else p.grad
            want = grads[name].grad
            worst = max(worst, ((got - want).abs().max() / want.abs().max().clamp_min(1e-12)).item())
        model.zero_grad(set_to_none=True)
        result["sp" if sp else "tp"] = {"loss_diff": abs(loss.item() - ref_loss.item()), "grad_rel_diff": worst,
                                        "saved": saved_bytes(model.train(), tokens[:batch])}
    with open(os.path.join(out, f"rank{dist.get_rank()}.json"), "w") as f:
        json.dump(result, f)
    dist.barrier()
    dist.destroy_process_group()


if __name__ == "__main__":
    main(sys.argv[1], *map(int, sys.argv[2:7]))

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
3. the LayerNorm step ("norms"): right after that backward, the LayerNorm (ln1, ln2, ln_f) weight and
   bias gradients as the optimizer gets them, each rank's LOCAL tensor (not full_tensor, which
   would sum them) with its placement; then one step as the trainer takes it (Lightning's
   torch.nn.utils.clip_grad_norm_, here at a max_norm that clips, then SGD with momentum) on the
   sharded model and on the unsharded copy, and the LayerNorm weights after it: compared across the
   TP ranks and with the copy's. With SP the LayerNorms see only their sequence shard, so their
   gradients are Partial(sum) (each rank's local value is its shard's contribution); DTensor
   reduces them inside the step, where an in-place update of a Replicate parameter (or its
   Replicate optimizer state) reads the Partial gradient: the collectives the step issues are
   counted (CommDebugMode).
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


def _is_norm(name: str) -> bool:
    return name.startswith("ln_f.") or ".ln1." in name or ".ln2." in name


MAX_NORM = 0.5  # below the test's gradient norm (0.95, test_sequence_parallel.py): the clip scales every gradient


def norm_step(model, ref) -> dict:
    """Section 3 of the module docstring, after model's and ref's backward on the same batch."""
    from torch.distributed.tensor.debug import CommDebugMode

    world = dist.get_world_size()
    want = dict(ref.named_parameters())
    norms = {n: p for n, p in model.named_parameters() if _is_norm(n)}
    before = {n: want[n].detach().clone() for n in norms}
    placements = sorted({str(getattr(p.grad, "placements", None)) for p in norms.values()})
    # each rank's own gradient against the whole one: ~1 with SP (a shard's part), ~0 without
    local_rel = max(((_local(p.grad) - want[n].grad).abs().max() / want[n].grad.abs().max()).item()
                    for n, p in norms.items())
    total = torch.nn.utils.clip_grad_norm_(model.parameters(), MAX_NORM)
    total = total.full_tensor() if hasattr(total, "full_tensor") else total
    ref_total = torch.nn.utils.clip_grad_norm_(ref.parameters(), MAX_NORM)
    opt = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
    with CommDebugMode() as comm:
        opt.step()
    torch.optim.SGD(ref.parameters(), lr=0.1, momentum=0.9).step()
    across = vs_single = update = 0.0
    for n, p in norms.items():
        w = _local(p).detach()
        ws = [torch.empty_like(w) for _ in range(world)]
        dist.all_gather(ws, w)
        across = max(across, max((x - ws[0]).abs().max().item() for x in ws))
        vs_single = max(vs_single, (w - want[n].detach()).abs().max().item())
        update = max(update, (want[n].detach() - before[n]).abs().max().item())
    return {"count": len(norms), "grad_placements": placements, "local_grad_rel_diff": local_rel,
            "total_norm": total.item(), "ref_total_norm": ref_total.item(),
            "step_collectives": {str(k): v for k, v in comm.get_comm_counts().items()},
            "weight_diff_across_ranks": across, "weight_diff_vs_single": vs_single, "single_update": update}


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
        norms = norm_step(model, ref)
        model.zero_grad(set_to_none=True)
        result["sp" if sp else "tp"] = {"loss_diff": abs(loss.item() - ref_loss.item()), "grad_rel_diff": worst,
                                        "norms": norms, "saved": saved_bytes(model.train(), tokens[:batch])}
    with open(os.path.join(out, f"rank{dist.get_rank()}.json"), "w") as f:
        json.dump(result, f)
    dist.barrier()
    dist.destroy_process_group()


if __name__ == "__main__":
    main(sys.argv[1], *map(int, sys.argv[2:7]))

"""The activation bytes each pipeline rank really holds, on torch's own schedules
(tests/integration/test_pipeline_activations.py, started by torchrun with one gloo rank per stage).
Not a test module itself: it writes one JSON file per rank.

For each case (schedule, micro-batches, virtual stages per rank, precision, checkpointing) the
`pipeline` strategy's own code trims a GPT to this rank's stage(s) and builds its schedule
(Pipeline.parallelize, Pipeline._build_schedule); three optimizer steps run. Every tensor autograd
saves for backward is counted while it is alive (saved_tensors_hooks: a handle per saved tensor,
released when autograd frees the node that saved it), each storage once; excluded: parameters and
tensors computed from one parameter alone (autocast's 16-bit weight copies), as in
tests/unit/test_plan_saved_tensors.py. The rank's peak of live saved bytes in steps 2 and 3 (the
first also runs the schedule's shape inference) is written. argv[2]: comma-separated case names.
"""
from __future__ import annotations

import contextlib
import json
import os
import sys
from types import SimpleNamespace

import torch
import torch.distributed as dist
from torch import nn

# name: (schedule, micro-batches, stages_per_rank, precision, activation checkpointing)
CASES = {
    "1f1b_m4": ("1f1b", 4, 1, "32", "none"),
    "gpipe_m4": ("gpipe", 4, 1, "32", "none"),
    "interleaved_m4": ("interleaved_1f1b", 4, 2, "32", "none"),
    "1f1b_m4_bf16": ("1f1b", 4, 1, "bf16-mixed", "none"),
    "gpipe_m4_bf16": ("gpipe", 4, 1, "bf16-mixed", "none"),
    "gpipe_m4_full": ("gpipe", 4, 1, "32", "full"),
    "1f1b_m8": ("1f1b", 8, 1, "32", "none"),
}
SHAPE = dict(n_layers=4, n_heads=4, d_model=64, seq_len=64, vocab_size=256)
MICRO_BATCH = 2


class LiveSaved:
    """Bytes of the storages autograd's saved tensors keep alive, now and at the peak; and, with
    `held` (the stage's own tensors: outputs kept for backward, receive buffers) and `grads`, the
    peak of all of them together, each storage once."""

    def __init__(self, params: set[int], held=lambda: [], grads=lambda: 0):
        self.params, self.storages, self.live, self.peak = params, {}, 0, 0
        self.held, self.grads, self.peak_held, self.peak_total = held, grads, 0, 0

    def sample(self) -> None:
        extra = {t.untyped_storage().data_ptr(): t.untyped_storage().nbytes() for t in self.held()}
        held = self.live + sum(n for k, n in extra.items() if k not in self.storages)
        self.peak_held = max(self.peak_held, held)
        self.peak_total = max(self.peak_total, held + self.grads())

    def pack(self, t: torch.Tensor):
        if t.device.type == "meta" or _from_parameter(t):
            return t
        key = t.untyped_storage().data_ptr()
        if key in self.params:
            return t
        entry = self.storages.setdefault(key, [0, t.untyped_storage().nbytes()])
        if entry[0] == 0:
            self.live += entry[1]
            self.peak = max(self.peak, self.live)
            self.sample()
        entry[0] += 1
        # detached: a handle holding a saved output would hold its own node (a reference cycle
        # that only backward breaks; the first stage's metadata inference has no backward)
        return _Handle(self, key, t.detach())

    def release(self, key: int) -> None:
        entry = self.storages[key]
        entry[0] -= 1
        if entry[0] == 0:
            self.live -= entry[1]
            del self.storages[key]


class _Handle:
    """What autograd keeps in place of a saved tensor; dropped when the saving node is freed."""
    __slots__ = ("owner", "key", "t")

    def __init__(self, owner: LiveSaved, key: int, t: torch.Tensor):
        self.owner, self.key, self.t = owner, key, t

    def __del__(self):
        self.owner.release(self.key)


def _unpack(h):
    return h.t if isinstance(h, _Handle) else h


def _from_parameter(t: torch.Tensor) -> bool:
    """A function of one parameter alone (a cast, transpose or view of it)."""
    fn = t.grad_fn
    while fn is not None:
        if type(fn).__name__ == "AccumulateGrad":
            return isinstance(fn.variable, nn.Parameter)
        nxt = [f for f, _ in fn.next_functions if f is not None]
        if len(nxt) != 1:
            return False
        fn = nxt[0]
    return False


def run_case(name: str) -> dict:
    from scalelab.models.gpt import GPT, GPTConfig
    from scalelab.strategies.pipeline import Pipeline

    schedule, m, v, precision, ckpt = CASES[name]
    torch.manual_seed(0)
    net = GPT(GPTConfig(**SHAPE, activation_checkpointing=ckpt))
    plan = Pipeline(schedule=schedule, microbatches=m, stages_per_rank=v)
    net = plan.parallelize(net, None)
    plan._build_schedule(SimpleNamespace(device=torch.device("cpu"), net=net))
    stages = plan._schedule._stages if v > 1 else [plan._schedule._stage]

    def held() -> list:
        """What torch's PipelineStage itself keeps: each micro-batch's output until its backward
        (fwd_cache), and the receive buffers of activations and gradients (one per micro-batch,
        allocated once by the first step)."""
        out = [t for st in stages for outs, _ in st.fwd_cache.values() for t in outs
               if isinstance(t, torch.Tensor)]
        for st in stages:
            for infos in [*st.args_recv_info.values(), *st.grad_recv_info.values()]:
                out += [i.buffer for i in infos if isinstance(getattr(i, "buffer", None), torch.Tensor)]
        return out

    def grads() -> int:
        return sum(p.grad.untyped_storage().nbytes() for p in net.parameters() if p.grad is not None)

    tracker = LiveSaved({p.untyped_storage().data_ptr() for p in net.parameters()}, held, grads)
    for st in stages:       # also sample right after each micro-batch's forward and backward
        for name_ in ("forward_one_chunk", "backward_one_chunk"):
            def sampled(*a, _f=getattr(st, name_), **k):
                r = _f(*a, **k)
                tracker.sample()
                return r
            setattr(st, name_, sampled)
    autocast = (lambda: torch.autocast("cpu", dtype=torch.bfloat16)) if precision == "bf16-mixed" \
        else contextlib.nullcontext
    peaks = []
    for _ in range(3):
        net.zero_grad(set_to_none=True)
        tokens = torch.randint(0, SHAPE["vocab_size"], (MICRO_BATCH * m, SHAPE["seq_len"] + 1))
        x, y = tokens[:, :-1], tokens[:, 1:]
        args = (x,) if plan.is_first else ()
        kwargs = {"target": y, "losses": []} if plan.is_last else {}
        tracker.peak = tracker.peak_held = tracker.peak_total = tracker.live
        plan._timer.start_step()     # as Pipeline.training_step runs it
        with torch.autograd.graph.saved_tensors_hooks(tracker.pack, _unpack), autocast():
            plan._schedule.step(*args, return_outputs=False, **kwargs)
        plan._timer.end_step()
        peaks.append((tracker.peak, tracker.peak_held, tracker.peak_total))
        assert tracker.live == 0, (name, tracker.live)   # backward freed every saved tensor
    steady = peaks[1:]
    return {"peak_saved_bytes": max(p[0] for p in steady), "peak_held_bytes": max(p[1] for p in steady),
            "peak_with_grads_bytes": max(p[2] for p in steady), "grad_bytes": grads(),
            "stage": plan._stage_idx, "stages": plan._pp}


def main(out: str, names: str, run_case=run_case) -> None:
    """Each case of `names` on this rank (run_case: another probe's, tests/integration/
    test_pipeline_dp_memory.py), written to out/rank{r}.json."""
    dist.init_process_group("gloo")
    torch.set_num_threads(1)
    result = {name: run_case(name) for name in names.split(",")}
    with open(os.path.join(out, f"rank{dist.get_rank()}.json"), "w") as f:
        json.dump(result, f)
    dist.barrier()
    dist.destroy_process_group()


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2])

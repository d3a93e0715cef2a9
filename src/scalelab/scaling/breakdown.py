"""Where a step's time goes, per rank: compute, communication, and waiting for other ranks.

Method (written into run.json as `breakdown.method`): torch.profiler records a short window
of optimizer steps at the end of training (excluded from the throughput figures). On each rank:
- comm_s: the union of the intervals of collective ops (gloo:*, nccl:*, c10d::*, all_reduce,
  all_gather, reduce_scatter, all_to_all, barrier) per step, on any thread;
- wait_s: comm_s minus the smallest comm_s of any rank. The rank that reaches a collective
  last spends only the transfer in it; every other rank also waits for it (a straggler makes
  the others wait);
- transfer_s = comm_s - wait_s;
- compute_s = step_s - comm_s: forward, backward, optimizer, data (on CPU/gloo, collectives
  are not overlapped with compute).
On CUDA the CPU-side collective ops only launch NCCL kernels, so the window also records CUDA
activity and reads the kernels from the trace (`gpu_comm`): comm_s is the time NCCL kernels run
while no other kernel runs (exposed communication, what the step pays), comm_total_s all NCCL
kernel time, overlapped_s what backward's compute hid.
The seed example: 100 ms on one device -> 50 ms compute + 10 ms all-reduce on two = 60 ms.
"""
from __future__ import annotations

import re
import time
from pathlib import Path

import lightning as L
import torch
from torch.profiler import ProfilerActivity, profile

_COMM = re.compile(r"(gloo:|nccl:|c10d::|record_param_comms|all_reduce|allreduce|all_gather|allgather|reduce_scatter|"
                   r"all_to_all|barrier)", re.I)  # not plain "broadcast": aten::broadcast_tensors is compute


def _union_length(intervals: list[tuple[float, float]]) -> float:
    total, end = 0.0, float("-inf")
    for a, b in sorted(intervals):
        if b <= end:
            continue
        total += b - max(a, end)
        end = b
    return total


class ProfileWindow(L.Callback):
    """Profiles this rank's optimizer steps [start_step, start_step + steps), counted from the
    first step of this run (a resumed run counts from its resume point)."""

    def __init__(self, start_step: int, steps: int, accumulate: int):
        self.start_step, self.steps, self.accumulate = start_step, steps, accumulate
        self._micro = self._done = 0
        self._offset = 0
        self._prof = None
        self._cuda = False
        self._t0 = 0.0
        self.result: dict | None = None

    def on_train_start(self, trainer, pl_module) -> None:
        self._offset = trainer.global_step

    def on_train_batch_start(self, trainer, pl_module, batch, batch_idx) -> None:
        if self._prof is None and self.result is None and self._micro == 0 \
                and trainer.global_step - self._offset == self.start_step:
            _sync(pl_module)
            self._cuda = pl_module.device.type == "cuda"
            self._prof = profile(activities=[ProfilerActivity.CPU]
                                 + ([ProfilerActivity.CUDA] if self._cuda else []))
            self._prof.__enter__()
            self._t0 = time.perf_counter()

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx) -> None:
        self._micro = (self._micro + 1) % self.accumulate
        if self._prof is None or self._micro:
            return
        self._done += 1
        if self._done < self.steps:
            return
        _sync(pl_module)
        wall = time.perf_counter() - self._t0
        self._prof.__exit__(None, None, None)
        step_s = wall / self.steps
        if self._cuda:
            import json
            import tempfile

            with tempfile.NamedTemporaryFile(suffix=".json") as f:
                self._prof.export_chrome_trace(f.name)
                g = gpu_comm(json.loads(Path(f.name).read_text()))
            self.result = {"step_s": step_s, "comm_s": min(g["exposed_us"] / 1e6 / self.steps, step_s),
                           "comm_total_s": g["total_us"] / 1e6 / self.steps,
                           "overlapped_s": (g["total_us"] - g["exposed_us"]) / 1e6 / self.steps,
                           "steps": self.steps, "source": "cuda kernels"}
        else:
            comm = [(e.time_range.start, e.time_range.end) for e in self._prof.events() if _COMM.search(e.name)]
            comm_s = _union_length(comm) / 1e6 / self.steps  # profiler times are in microseconds
            self.result = {"step_s": step_s, "comm_s": min(comm_s, step_s), "steps": self.steps,
                           "source": "cpu ops"}
        self._prof = None


def gpu_comm(trace: dict) -> dict:
    """NCCL time on the device from a chrome trace (torch.profiler export_chrome_trace): the
    union of NCCL kernel intervals (total_us), and the part of it during which no other kernel
    runs (exposed_us = total - overlap with compute kernels). Kernel events are complete events
    ("ph": "X") of category "kernel"; NCCL's are named ncclKernel_* / ncclDevKernel_*."""
    comm, other = [], []
    for e in trace.get("traceEvents", []):
        if e.get("ph") != "X" or str(e.get("cat", "")).lower() != "kernel":
            continue
        start = float(e["ts"])
        (comm if str(e.get("name", "")).lower().startswith("nccl") else other).append(
            (start, start + float(e.get("dur", 0))))
    total = _union_length(comm)
    overlap = total + _union_length(other) - _union_length(comm + other)
    return {"total_us": total, "exposed_us": total - overlap, "kernels": len(comm)}


def _sync(pl_module) -> None:
    if pl_module.device.type == "cuda":
        torch.cuda.synchronize()


def combine(per_rank: list[dict | None]) -> dict | None:
    """Per-rank compute / transfer / wait from each rank's window (see module docstring)."""
    if not per_rank or any(r is None for r in per_rank):
        return None
    min_comm = min(r["comm_s"] for r in per_rank)
    ranks = [{"step_s": r["step_s"], "compute_s": r["step_s"] - r["comm_s"], "comm_s": r["comm_s"],
              "transfer_s": min_comm, "wait_s": r["comm_s"] - min_comm,
              **{k: r[k] for k in ("comm_total_s", "overlapped_s") if k in r}} for r in per_rank]
    computes = [r["compute_s"] for r in ranks]
    mean_compute = sum(computes) / len(computes)
    return {
        "method": "torch.profiler window at the end of training; comm = union of collective-op intervals; "
                  "wait = comm - min over ranks of comm; compute = step - comm (see scalelab.scaling.breakdown)",
        "profiled_steps": per_rank[0]["steps"],
        "source": per_rank[0].get("source", "cpu ops"),
        "per_rank": ranks,
        "straggler_rank": max(range(len(ranks)), key=lambda i: computes[i]),
        "compute_imbalance": max(computes) / mean_compute if mean_compute > 0 else None,
        "comm_fraction": sum(r["comm_s"] for r in ranks) / sum(r["step_s"] for r in ranks),
        "wait_fraction": sum(r["wait_s"] for r in ranks) / sum(r["step_s"] for r in ranks),
    }

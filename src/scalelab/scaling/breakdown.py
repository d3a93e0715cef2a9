"""Where a step's time goes, per rank: compute, communication, and waiting for other ranks.

Method (written into run.json as `breakdown.method`): torch.profiler records a short window
of optimizer steps at the end of training (excluded from the throughput figures). On each rank:
- comm_s: exposed communication: the time a collective or point-to-point op (gloo:*, nccl:*,
  c10d::*, all_reduce, all_gather, reduce_scatter, all_to_all, barrier; on any thread) is in
  flight while the training thread runs no aten op (cpu_comm_us). gloo runs collectives on its
  own threads, from when they are posted to when they end: DDP's bucket all-reduces overlap the
  rest of backward, a pipeline posts its sends and receives ahead of the stage's compute. Their
  whole intervals counted 72 of a 93 ms DDP step as communication where compute without any
  took 44-52 ms, and compute + comm of a pipeline stage exceeded its step. The CPU analog of the
  CUDA path's NCCL time with no other kernel running;
- wait_s: comm_s minus the smallest comm_s of any rank. The rank that reaches a collective
  last spends only the transfer in it; every other rank also waits for it (a straggler makes
  the others wait);
- transfer_s = comm_s - wait_s;
- compute_s = step_s - comm_s: forward, backward, optimizer, data, and the host's Python between
  ops while nothing is in flight. A pipeline's bubble is a stage waiting on a receive: comm (its
  wait_s where the other stage waits less; run.json's pipeline.idle_fraction_per_stage has it).
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

from scalelab.checkpointing import SAVE_MARK

_COMM = re.compile(r"(gloo:|nccl:|c10d::|record_param_comms|all_reduce|allreduce|all_gather|allgather|reduce_scatter|"
                   r"all_to_all|barrier)", re.I)  # not plain "broadcast": aten::broadcast_tensors is compute


_WAIT = re.compile(r"wait_tensor|c10d::wait")   # a thread blocked on a collective's result


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
        with torch.profiler.record_function(_DRAIN):
            _drain_collectives()
        self._prof.__exit__(None, None, None)
        # a periodic checkpoint saved inside the window (at its last step when checkpoint.every_n_steps
        # divides max_steps) is in no step's time, as in the step timer's: its barriers made single@2
        # show 16-83 % comm
        events = self._prof.events()
        saves = [(e.time_range.start, e.time_range.end) for e in events if e.name == SAVE_MARK]
        step_s = max(wall - _union_length(saves) / 1e6, 0.0) / self.steps
        if self._cuda:
            import json
            import tempfile

            with tempfile.NamedTemporaryFile(suffix=".json") as f:
                self._prof.export_chrome_trace(f.name)
                trace = outside_saves(json.loads(Path(f.name).read_text()))
            g = gpu_comm(trace)
            self.result = {"step_s": step_s, "comm_s": min(g["exposed_us"] / 1e6 / self.steps, step_s),
                           "comm_total_s": g["total_us"] / 1e6 / self.steps,
                           "overlapped_s": (g["total_us"] - g["exposed_us"]) / 1e6 / self.steps,
                           "steps": self.steps, "source": "cuda kernels",
                           "device": device_anatomy(trace, self.steps, step_s),
                           "top_host_ops_ms": top_host_ops(self._prof, self.steps)}
        else:
            comm_s = cpu_comm_us(events, saves) / 1e6 / self.steps  # profiler times are in microseconds
            self.result = {"step_s": step_s, "comm_s": min(comm_s, step_s), "steps": self.steps,
                           "source": "cpu ops"}
        self._prof = None


def cpu_comm_us(events, saves: list[tuple[float, float]]) -> float:
    """Exposed communication in a CPU profile (module docstring): the union of the collective and
    point-to-point ops' intervals, less where the training thread (the one that recorded _DRAIN,
    from the window's callback) runs an aten op. Ops from the drain's barrier on, and in a
    checkpoint save, are left out."""
    drain = [e for e in events if e.name == _DRAIN]
    drain_at = min((e.time_range.start for e in drain), default=float("inf"))
    main = drain[0].thread if drain else None

    def kept(e) -> bool:
        return e.time_range.start < drain_at and not any(a <= e.time_range.start < b for a, b in saves)

    comm = [(e.time_range.start, e.time_range.end) for e in events if _COMM.search(e.name) and kept(e)]
    busy = [(e.time_range.start, e.time_range.end) for e in events
            if e.thread == main and e.name.startswith("aten::") and not _COMM.search(e.name) and kept(e)]
    # a wait on a collective inside an op is no compute: DTensor's async collectives (tp, fsdp_tp,
    # nd) return tensors whose next op waits for them (_c10d_functional::wait_tensor inside an
    # aten::addmm): 25-40 % of a tp step's communication read as compute
    waits = [(e.time_range.start, e.time_range.end) for e in events
             if e.thread == main and _WAIT.search(e.name) and kept(e)]
    computing = _minus(busy, waits)
    return _union_length(comm + waits + computing) - _union_length(computing)   # |comm less computing|


def _merged(intervals: list[tuple[float, float]]) -> list[list[float]]:
    out: list[list[float]] = []
    for a, b in sorted(intervals):
        if out and a <= out[-1][1]:
            out[-1][1] = max(out[-1][1], b)
        else:
            out.append([a, b])
    return out


def _minus(xs: list[tuple[float, float]], ys: list[tuple[float, float]]) -> list[tuple[float, float]]:
    """union(xs) less union(ys), as intervals."""
    out, cut = [], _merged(ys)
    for a, b in _merged(xs):
        for c, d in cut:
            if d <= a or c >= b:
                continue
            if c > a:
                out.append((a, c))
            a = max(a, d)
            if a >= b:
                break
        if a < b:
            out.append((a, b))
    return out


def outside_saves(trace: dict) -> dict:
    """The trace without the device work of periodic checkpoint saves (SAVE_MARK, on the host's
    and the device's timeline): a save's NCCL barrier waits on the device while rank 0 writes, and
    its device-to-host copies would count as busy, in no step's time."""
    saves = [(float(e["ts"]), float(e["ts"]) + float(e.get("dur", 0))) for e in trace.get("traceEvents", [])
             if e.get("name") == SAVE_MARK and e.get("ph") == "X"]
    if not saves:
        return trace
    device = ("kernel", "gpu_memcpy", "gpu_memset")
    kept = [e for e in trace.get("traceEvents", []) if not (
        e.get("ph") == "X" and str(e.get("cat", "")).lower() in device
        and any(a <= float(e["ts"]) < b for a, b in saves))]
    return {**trace, "traceEvents": kept}


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


def device_anatomy(trace: dict, steps: int, step_s: float, top: int = 12) -> dict:
    """Where a CUDA step's wall time goes: device busy (the union of all kernel and memcpy/memset
    intervals) vs idle (the device waited for the host: launch overhead, host syncs, Python),
    and the kernels that take the most device time, per step. A strategy slower than `single` at
    world size 1 shows here as more idle time (host-bound) or as extra kernels (casts, copies)."""
    busy, per_name = [], {}
    for e in trace.get("traceEvents", []):
        if e.get("ph") != "X" or str(e.get("cat", "")).lower() not in ("kernel", "gpu_memcpy", "gpu_memset"):
            continue
        a, d = float(e["ts"]), float(e.get("dur", 0))
        busy.append((a, a + d))
        name = str(e.get("name", ""))[:90]
        n = per_name.setdefault(name, [0.0, 0])
        n[0] += d
        n[1] += 1
    busy_s = _union_length(busy) / 1e6 / steps
    kernels = sorted(per_name.items(), key=lambda kv: -kv[1][0])[:top]
    return {"busy_s": busy_s, "idle_s": max(step_s - busy_s, 0.0), "kernels_per_step": sum(
        n[1] for n in per_name.values()) / steps, "top_kernels_ms": [
        {"name": k, "ms": v[0] / 1e3 / steps, "calls": v[1] / steps} for k, v in kernels]}


def top_host_ops(prof, steps: int, top: int = 12) -> list[dict]:
    """The host-side ops with the most self CPU time per step (what keeps a host-bound step busy)."""
    try:
        rows = sorted(prof.key_averages(), key=lambda e: -e.self_cpu_time_total)[:top]
    except Exception:  # noqa: BLE001 - a summary only; the breakdown stands without it
        return []
    return [{"name": e.key[:90], "ms": e.self_cpu_time_total / 1e3 / steps, "calls": e.count / steps} for e in rows]


_DRAIN = "scalelab::profile_drain"


def _drain_collectives() -> None:
    """Fixes ranks aborting with glibc heap corruption ("malloc(): unsorted double linked list
    corrupted", ~1 in 20 2-rank ddp_powersgd runs on CPU, forked or torchrun ranks alike) when the
    window stops torch.profiler while a gloo worker thread is still finishing a collective: gloo
    completes a work's future (running the DDP comm hook's callbacks and waking this thread)
    before Work::finish ends the work's profiler event, which then writes into event storage the
    profiler has just freed. ProcessGroupGloo's barrier waits for every work in flight or queued
    to finish first (its recorded time is left out of comm_s)."""
    # gloo only: NCCL's collectives run on the device, which _sync has already drained
    if torch.distributed.is_available() and torch.distributed.is_initialized() \
            and torch.distributed.get_backend() == "gloo":
        torch.distributed.barrier()


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
              **{k: r[k] for k in ("comm_total_s", "overlapped_s", "device", "top_host_ops_ms") if k in r}}
             for r in per_rank]
    computes = [r["compute_s"] for r in ranks]
    mean_compute = sum(computes) / len(computes)
    return {
        "method": "torch.profiler window at the end of training; comm = collective/p2p ops in flight while the "
                  "training thread runs no compute op (CUDA: NCCL kernels while no other kernel runs); "
                  "wait = comm - min over ranks of comm; compute = step - comm (see scalelab.scaling.breakdown)",
        "profiled_steps": per_rank[0]["steps"],
        "source": per_rank[0].get("source", "cpu ops"),
        "per_rank": ranks,
        "straggler_rank": max(range(len(ranks)), key=lambda i: computes[i]),
        "compute_imbalance": max(computes) / mean_compute if mean_compute > 0 else None,
        "comm_fraction": sum(r["comm_s"] for r in ranks) / sum(r["step_s"] for r in ranks),
        "wait_fraction": sum(r["wait_s"] for r in ranks) / sum(r["step_s"] for r in ranks),
    }

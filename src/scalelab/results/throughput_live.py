"""The live (logged) throughput view, without Lightning's per-step device drain.

Lightning's ThroughputMonitor calls `torch.cuda.synchronize()` on rank 0 after every training
batch (callbacks/throughput_monitor.py `_update`: "required or else perf_counter() won't be
correct"). On a GPU that drains the device queue every step, so the host's per-step work
(Lightning's loop, hooks, the data loader) shows up as idle device time on rank 0, and in a
multi-rank job every rank waits for rank 0 at the next collective: the measured step times
include a cost the user's own training would not have. Issue 11 measured `single` at 0.92 of a
hand-written loop on an H200 with ~4 ms/step more idle device time; this sync is a cause found by
reading the source of the callbacks ScaleLab turns on (its cost is not measured yet: no GPU was
lent when it was removed).

Here the same callback runs without that sync. Its figures are a rolling window (10 steps) of
host timestamps; in steady state the host cannot run more than a bounded queue ahead of the
device, so over the window they track the device's rate. The run record's step times do not
come from here: StepMetrics times steps with CUDA events read after training.
"""
from __future__ import annotations

from typing import Any

import torch
from lightning.fabric.utilities.throughput import Throughput
from lightning.pytorch.callbacks import ThroughputMonitor


def _no_sync(device: Any = None) -> None:
    return None


class _JobThroughput(Throughput):
    """Lightning's global figures are the device's times the world size; where `replicas` devices
    (tensor-parallel peers, pipeline stages) work on the same samples, the job's are the device's
    times the data-parallel size (world / replicas): tp=4 at 16 samples/s logged 64. At world size
    1 Lightning logs the device's figures only: the job's are the same (a W&B chart of
    train/samples_per_sec across a sweep had no point of its 1-rank jobs)."""

    replicas = 1

    def compute(self) -> dict:
        out = super().compute()
        if self.world_size == 1:
            for key in ("batches_per_sec", "samples_per_sec", "items_per_sec", "flops_per_sec"):
                if f"device{self.separator}{key}" in out:
                    out[key] = out[f"device{self.separator}{key}"]
        for key in ("batches_per_sec", "samples_per_sec", "items_per_sec"):
            if key in out:
                out[key] /= self.replicas
        return out


class LiveThroughput(ThroughputMonitor):
    """ThroughputMonitor whose per-batch update does not synchronize the CUDA device, and whose
    global samples/items per second count each sample once (`replicas`: devices that share each
    sample, tp x pp) and are logged at world size 1 too."""

    def __init__(self, *args: Any, replicas: int = 1, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.replicas = max(1, int(replicas))

    def setup(self, trainer: Any, pl_module: Any, stage: str) -> None:
        super().setup(trainer, pl_module, stage)
        for t in self._throughputs.values():   # built by Lightning's setup: same state, our compute
            t.__class__, t.replicas = _JobThroughput, self.replicas

    def _update(self, trainer: Any, pl_module: Any, batch: Any, iter_num: int) -> None:
        # Lightning's _update calls torch.cuda.synchronize() by attribute at call time; for the
        # duration of that call (rank 0's main thread, between two steps) it is a no-op.
        sync = torch.cuda.synchronize
        torch.cuda.synchronize = _no_sync
        try:
            super()._update(trainer, pl_module, batch, iter_num)
        finally:
            torch.cuda.synchronize = sync

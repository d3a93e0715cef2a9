"""How many synchronizing CUDA calls each steady training step makes, measured on the device
(`trainer.count_device_syncs: true`; benchmarks/gpu_check.py turns it on).

A host read of a device value (`.item()`, `bool(t)`, a blocking copy, `torch.cuda.synchronize()`)
drains the device queue: the device idles while the host prepares the next kernels. The CPU tests
find such reads with a detector of the ops that would sync (tests/host_syncs.py); this is the same
question asked of the real device: torch's CUDA sync debug mode (`torch.cuda.set_sync_debug_mode
("warn")`) warns on every synchronizing call torch makes (stream / device synchronize, a copy that
ends in a stream sync, `.item()`), and each warning is counted here with the innermost frame
outside torch that asked. It does not see NCCL's own waits, `Event.synchronize()` (the lagged
reads of scaling.metrics wait on an old event on purpose), the driver's implicit wait in a copy
from pageable host memory (data.pin_memory removes that one); a sync made on autograd's backward
thread (a gradient hook) is counted when backward returns (torch's engine replays its warnings in
the calling thread), with the backward call as its origin. So a count is a lower bound; the
profile window's idle device time is the cross-check.

run.json `device_syncs`: per rank, the steady steps counted, syncs per step, and the top origins.
"""
from __future__ import annotations

import collections
import os
import sys
import warnings
from typing import Any

import lightning as L
import torch

MESSAGE = "called a synchronizing CUDA operation"
_HERE = os.path.abspath(__file__)


def _origin() -> str:
    """The innermost frame of the warning's caller outside torch, warnings and this file. A walk
    of the frames, no source lines read: this runs inside the steps being timed, once per sync
    (traceback.extract_stack built and looked up the whole stack each time)."""
    f = sys._getframe(1)
    while f is not None:
        path = f.f_code.co_filename
        if not (f"{os.sep}torch{os.sep}" in path or path.endswith(os.sep + "warnings.py") or path == _HERE
                or os.path.abspath(path) == _HERE):
            short = path.split("site-packages" + os.sep, 1)[-1].split("src" + os.sep, 1)[-1]
            return f"{short}:{f.f_lineno} ({f.f_code.co_name})"
        f = f.f_back
    return "torch"


class DeviceSyncCounter(L.Callback):
    """Counts torch's synchronizing CUDA calls in steps first..last (1-based optimizer steps; the
    warm-up and the profiled steps are left out, as for the step times). Off CUDA it records
    nothing. `set_mode` is torch.cuda.set_sync_debug_mode (replaceable in tests)."""

    def __init__(self, first: int, last: int, set_mode: Any = None):
        self.first, self.last = first, last
        self._set_mode = set_mode
        self.counts: collections.Counter = collections.Counter()
        self.per_step: collections.Counter = collections.Counter()
        self._on = False
        self._step = 0
        self._show = None
        self._filter = None
        self.active = False

    # -- the warning hook ------------------------------------------------------------------
    def _showwarning(self, message, category, filename, lineno, file=None, line=None):
        if self._on and MESSAGE in str(message):
            self.counts[_origin()] += 1
            self.per_step[self._step] += 1
            return
        return self._show(message, category, filename, lineno, file, line)

    def _enable(self) -> None:
        self._show, warnings.showwarning = warnings.showwarning, self._showwarning
        warnings.filterwarnings("always", message=f".*{MESSAGE}.*")   # every one, not once per place
        self._filter = warnings.filters[0]
        (self._set_mode or torch.cuda.set_sync_debug_mode)("warn")
        self._on = True

    def _disable(self) -> None:
        if not self._on:
            return
        (self._set_mode or torch.cuda.set_sync_debug_mode)("default")
        warnings.showwarning = self._show
        if self._filter in warnings.filters:
            warnings.filters.remove(self._filter)
            warnings._filters_mutated()
        self._on = False

    # -- Lightning hooks -------------------------------------------------------------------
    def on_train_start(self, trainer, pl_module) -> None:
        self.active = trainer.strategy.root_device.type == "cuda" and self.last >= self.first

    def on_train_batch_start(self, trainer, pl_module, batch, batch_idx) -> None:
        if not self.active:
            return
        self._step = trainer.global_step + 1          # the optimizer step this batch belongs to
        if self.first <= self._step <= self.last and not self._on:
            self._enable()
        elif self._step > self.last:
            self._disable()

    def on_train_end(self, trainer, pl_module) -> None:
        self._disable()

    def result(self) -> dict | None:
        """This rank's figures (None off CUDA)."""
        if not self.active:
            return None
        steps = self.last - self.first + 1
        return {"steps": [self.first, self.last], "per_step": sum(self.counts.values()) / steps,
                "max_in_a_step": max(self.per_step.values(), default=0),
                "origins": dict(self.counts.most_common(5)), "method": "torch.cuda.set_sync_debug_mode('warn')"}

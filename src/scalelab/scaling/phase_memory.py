"""Device memory peak of each phase of one steady optimizer step (run.json
`memory.peak_device_bytes_by_phase_per_rank`), on CUDA ranks.

Why: the planner predicts one peak from model states, activations and buffers, and which of
them coincide depends on the strategy. Lightning's automatic optimization zeroes gradients
inside its closure after training_step and before backward, so under single, ddp, fsdp and tp
the previous step's gradients were alive at the end of forward, when the activations peak (the
H200 runs up to run 3); LitModule now frees them right after the optimizer step, and the planner
counts the larger of gradients and activations there (plan.model_states.grads_at_peak; DDP's
buckets and accumulation keep them). DeepSpeed ZeRO-1/2 allocate their gradient partition and
buckets in backward and free them in the step: counted as the sum, the planner put zero2 3-7 %
over on the H200, by its 16-bit gradient bytes (now 1.001 and 1.004). The overall peak alone
cannot tell which phase set it; this records it.

How: at each phase boundary of the chosen step (forward: from the batch's start, or from the
previous micro-batch's backward, to `on_before_backward`; backward: to `on_after_backward`;
optimizer_step: from the last backward to the end of the batch: clipping and the optimizer step;
Lightning's zero_grad falls in the forward phase, just before backward), the allocator's peak since the previous boundary is read and the peak counter
reset (`torch.cuda.max_memory_allocated` / `reset_peak_memory_stats`: host-side counters of the
caching allocator, no device sync). Resetting loses the process-wide peak the run record also
reports, so the largest values read (from before the step too) are kept, and `merged` reports
the larger of them and the counters at the end of training.
"""
from __future__ import annotations

from typing import Callable

import torch

PHASES = ("forward", "backward", "optimizer_step")


def cuda_peaks(device: torch.device) -> dict[str, int]:
    return {"peak_allocated": torch.cuda.max_memory_allocated(device),
            "peak_reserved": torch.cuda.max_memory_reserved(device)}


def cuda_reset(device: torch.device) -> None:
    torch.cuda.reset_peak_memory_stats(device)


class PhasePeaks:
    """Peaks of the phases of optimizer step number `step` (0-based: that many steps completed
    before it). StepMetrics calls the hooks; `read` / `reset` are the allocator's counters
    (fakes in tests)."""

    def __init__(self, step: int, accumulate: int, read: Callable | None = None,
                 reset: Callable | None = None):
        self.step, self.accumulate = step, accumulate
        self.read, self.reset = read or cuda_peaks, reset or cuda_reset
        self.by_phase: dict[str, int] = {}
        self.reserved_floor = self.allocated_floor = 0
        self._phase: str | None = None
        self._device: torch.device | None = None
        self._micro = 0

    def _close(self, next_phase: str | None) -> None:
        mem = self.read(self._device)
        alloc, reserved = int(mem["peak_allocated"]), int(mem["peak_reserved"])
        self.allocated_floor = max(self.allocated_floor, alloc)
        self.reserved_floor = max(self.reserved_floor, reserved)
        if self._phase is not None:
            self.by_phase[self._phase] = max(self.by_phase.get(self._phase, 0), alloc)
        self.reset(self._device)
        self._phase = next_phase

    # -- hooks (StepMetrics) --------------------------------------------------------------------
    def batch_start(self, device: torch.device, steps_done: int) -> None:
        if device.type != "cuda" or steps_done != self.step or self._phase is not None:
            return
        if self._micro == 0:               # the step's first micro-batch: what came before is no phase
            self._device = device
            self._close("forward")

    def before_backward(self) -> None:
        if self._phase is not None:
            self._close("backward")

    def after_backward(self) -> None:
        if self._phase == "backward":
            self._micro += 1
            # more micro-batches to come: their forward starts here (the batch end in between
            # does no work of its own); after the last, the optimizer step
            self._close("forward" if self._micro < self.accumulate else "optimizer_step")

    def batch_end(self) -> None:
        if self._phase == "optimizer_step":
            self._close(None)

    def record(self) -> dict | None:
        """This rank's phase peaks, once the step is complete."""
        if set(self.by_phase) != set(PHASES):
            return None
        return {"step": self.step, **{p: self.by_phase[p] for p in PHASES}}

    def merged(self, peaks: dict) -> dict:
        """read_peaks()'s figures at the end of training with this step's: the counters were
        reset at the phase boundaries, so the process-wide peak is the larger of what they read
        then and now; plus `peak_device_bytes_by_phase` once the step is complete."""
        if "peak_device_bytes" not in peaks or self._device is None:
            return peaks
        out = {**peaks, "peak_device_bytes": max(peaks["peak_device_bytes"], self.allocated_floor),
               "peak_device_reserved_bytes": max(peaks["peak_device_reserved_bytes"], self.reserved_floor)}
        if self.record():
            out["peak_device_bytes_by_phase"] = self.record()
        return out

"""Per-rank measurements for the run record: step times, loss per optimizer step, memory.

Nothing here communicates during training; everything is gathered once, after fit
(gather_all), so the measurement does not perturb the communication it measures.
"""
from __future__ import annotations

import collections
import resource
import time
from typing import Any, Callable

import lightning as L
import torch
import torch.distributed as dist
from lightning.pytorch.callbacks import LearningRateMonitor


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def record_event(device: torch.device):
    """A timing CUDA event recorded on the current stream of `device`; None off CUDA."""
    if device.type != "cuda":
        return None
    event = torch.cuda.Event(enable_timing=True)
    event.record(torch.cuda.current_stream(device))
    return event


# ---- device values read on the host without draining the device queue -----------------------
# On CUDA, reading a device value (`.item()`, `bool(t)`, `float(t)`, `.cpu()`) waits for every
# kernel queued before it: the queue drains and the device idles while the host prepares the next
# step. A per-step read of a value the host needs (a logged loss, a stop flag) is made LAG steps
# late instead: the value is copied (non_blocking) into pinned host memory with a CUDA event
# behind the copy, and LAG steps later the host waits on that old event only, while the newer
# steps are still queued on the device. tests/unit/test_host_syncs.py checks the platform adds no
# other per-step read.
LAG_STEPS = 2
# Every this many steps StepMetrics moves its older step events and losses off the device (flush_old).
FLUSH_EVERY = 1000


def host_copy(value: torch.Tensor) -> tuple[torch.Tensor, Any]:
    """(host tensor, event): on CUDA a pinned copy filled by a non_blocking copy and the CUDA event
    recorded after it on the current stream (the copy is complete once the event is); off CUDA
    (value, None): the value is already on the host."""
    if value.device.type != "cuda":
        return value.detach(), None
    host = torch.empty(value.shape, dtype=value.dtype, device="cpu", pin_memory=True)
    host.copy_(value.detach(), non_blocking=True)
    event = torch.cuda.Event()
    event.record(torch.cuda.current_stream(value.device))
    return host, event


def read_host(host: torch.Tensor) -> list:
    """The values of a host tensor (host_copy's, once its event completed): no device is read."""
    if host.device.type != "cpu":
        raise ValueError(f"read_host reads host memory only, got a tensor on {host.device}")
    return host.reshape(-1).tolist()


class LaggedReads:
    """Values pushed once per step, read on the host `lag` pushes later on CUDA (at once off CUDA).

    push(key, tensor) returns the (key, values) pairs due at this push, oldest first. On CUDA the
    pair pushed at push n is returned by push n + lag, after waiting on its own event only: the
    same push on every rank returns the same keys, so ranks that push once per step agree on the
    step a value is acted on. drain() returns every pending pair (one wait; end of training)."""

    def __init__(self, lag: int = LAG_STEPS, copy: Callable | None = None):
        self.lag, self._copy = lag, copy or (lambda value: host_copy(value))  # host_copy: looked up per call
        self._pending: collections.deque = collections.deque()

    def push(self, key: Any, value: torch.Tensor) -> list[tuple[Any, list]]:
        host, event = self._copy(value)
        self._pending.append((key, host, event))
        return self._due(self.lag if event is not None else 0)

    def drain(self) -> list[tuple[Any, list]]:
        return self._due(0)

    def _due(self, keep: int) -> list[tuple[Any, list]]:
        out = []
        while len(self._pending) > keep:
            key, host, event = self._pending.popleft()
            if event is not None:
                event.synchronize()   # an old event: the device has the newer steps still queued
            out.append((key, read_host(host)))
        return out

    def __len__(self) -> int:
        return len(self._pending)


def host_speed(seconds: float = 0.1, n: int = 256) -> float:
    """FLOP/s this process gets from repeated fp32 n x n matmuls for `seconds` (mean, not best:
    it includes what the host takes away, as training would feel it).

    Measured by every rank at the start and the end of training, at the same moment (so with
    its neighbours busy): a shared or virtualised host's speed drifts by tens of % over minutes,
    and this is what lets the planner compare runs made at different times."""
    a, b = torch.randn(n, n), torch.randn(n, n)
    torch.mm(a, b)
    calls, t0 = 0, time.perf_counter()
    while True:
        torch.mm(a, b)
        calls += 1
        elapsed = time.perf_counter() - t0
        if elapsed >= seconds:
            return 2 * n ** 3 * calls / elapsed


class StepMetrics(L.Callback):
    def __init__(self, accumulate: int, plan: Any, phase_peaks: Any = None):
        self.accumulate, self.plan = accumulate, plan
        self.phase_peaks = phase_peaks       # scaling.phase_memory.PhasePeaks (CUDA ranks), or None
        self.step_times: list[float] = []
        self.losses: list[float] = []
        self.global_steps: list[int] = []  # optimizer step numbers (continue after a resume)
        # a resumed run's earlier steps (checkpointing.read_curve): in the record's curve, not its figures
        self.prior: dict = {"global_steps": [], "losses": []}
        self._micro: list[torch.Tensor] = []
        self._t_last = 0.0
        self.grad_bytes = 0
        self.last_lr: float | None = None
        self.state: dict[str, int] = {}
        self.host_flops: list[float] = []    # host_speed() at the start and end of training
        self.peaks: dict | None = None       # read_peaks() at the end of training
        self.first_step_at = self.last_step_at = None  # epoch s at the end of the first / last step
        # On CUDA, step boundaries are CUDA events read after training (not a host sync per step,
        # which drains the device queue and leaves the device idle while the host prepares the
        # next step; a plain training loop lets the host run ahead). Intervals between
        # consecutive events on the stream are the steps' device-timeline durations, idle gaps
        # included. Losses stay device tensors until then (or until flush_old, every FLUSH_EVERY steps).
        self._events: list = []              # (start, end) event per optimizer step, unread
        self._last_event = None
        self._pending_losses: list[torch.Tensor] = []
        self._loss_reads = LaggedReads(lag=1)   # older losses' host copies, in step order (flush_old)

    def on_train_start(self, trainer, pl_module) -> None:
        if pl_module.device.type == "cpu":
            self.host_flops.append(host_speed())
        _sync(pl_module.device)
        self._t_last = time.perf_counter()
        self._last_event = record_event(pl_module.device)

    def on_train_end(self, trainer, pl_module) -> None:
        self.resolve()
        if pl_module.device.type == "cpu":
            self.host_flops.append(host_speed())
        # Peaks of training itself: read now, before Lightning's teardown and before any
        # checkpoint or consolidated export the job does after fit.
        self.peaks = read_peaks(trainer.strategy.root_device)
        if self.phase_peaks is not None:
            self.peaks = self.phase_peaks.merged(self.peaks)

    def on_validation_end(self, trainer, pl_module) -> None:
        # Validation (trainer.val_every_n_steps) runs after one step's on_train_batch_end: the
        # next step's time starts when it ends, so validation is in no step's time.
        self.restart_clock(pl_module.device)

    def checkpoint_saved(self, trainer) -> None:
        """PeriodicCheckpoint.after_save: the step after a save is timed from its end."""
        self.restart_clock(trainer.strategy.root_device)

    def restart_clock(self, device: torch.device) -> None:
        """The next step's time starts now: what ran since the last step ended (validation, a
        periodic checkpoint's save: PeriodicCheckpoint.after_save) is in no step's time."""
        _sync(device)
        self._t_last = time.perf_counter()
        self._last_event = record_event(device)

    def on_train_batch_start(self, trainer, pl_module, batch, batch_idx) -> None:
        if self.phase_peaks is not None:
            self.phase_peaks.batch_start(trainer.strategy.root_device, len(self.global_steps))

    def on_before_backward(self, trainer, pl_module, loss) -> None:
        if self.phase_peaks is not None:
            self.phase_peaks.before_backward()

    def on_after_backward(self, trainer, pl_module) -> None:
        if self.phase_peaks is not None:
            self.phase_peaks.after_backward()

    def on_before_optimizer_step(self, trainer, pl_module, optimizer) -> None:
        # the LR this step uses (the optimizer's after fit is the scheduler's next one: run.json lr_final)
        self.last_lr = optimizer.param_groups[0]["lr"]
        if not self.grad_bytes:  # gradients exist only between backward and the optimizer step
            self.grad_bytes = self.plan.grad_bytes(trainer, pl_module)

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx) -> None:
        if self.phase_peaks is not None:
            self.phase_peaks.batch_end()
        self._micro.append(outputs["raw_loss"])
        if len(self._micro) < self.accumulate:
            return
        loss = torch.stack(self._micro).float().mean()   # this rank's step loss (mean over micro-batches)
        event = record_event(pl_module.device)
        if event is not None:
            self._events.append((self._last_event, event))
            self._last_event = event
        else:
            now = time.perf_counter()
            self.step_times.append(now - self._t_last)
            self._t_last = now
        self._pending_losses.append(loss.detach())  # read after training (resolve): no per-step read
        self.last_step_at = time.time()
        if self.first_step_at is None:
            self.first_step_at = self.last_step_at
        self.global_steps.append(trainer.global_step)
        self._micro = []
        if len(self._pending_losses) >= FLUSH_EVERY:
            self.flush_old()
        if len(self.global_steps) == 1:  # optimizer state exists after the first step
            self.state = self.plan.state_bytes(trainer, pl_module)

    def flush_old(self) -> None:
        """Bounded memory on long runs, without draining the device queue: the step events older
        than LAG_STEPS are read (waiting on an old event only) and released, and the pending losses
        go to one pinned host copy (non_blocking) read at the next flush: a CUDA event pair and a
        device scalar per step would otherwise pile up for the whole run (100k steps: ~50 MB of
        device memory in 512-byte allocator blocks, counted in the run's own peak)."""
        self._take_losses(self._loss_reads.drain())   # copied FLUSH_EVERY steps ago: long done
        self._read_events(keep=LAG_STEPS)
        if self._pending_losses:
            self._take_losses(self._loss_reads.push(None, torch.stack(self._pending_losses)))
            self._pending_losses = []

    def _take_losses(self, due: list) -> None:
        for _, values in due:
            self.losses.extend(values)

    def _read_events(self, keep: int) -> None:
        """Step times of the events but the newest `keep`, after waiting on the last one read."""
        n = len(self._events) - keep
        if n > 0:
            self._events[n - 1][1].synchronize()
            self.step_times.extend(a.elapsed_time(b) / 1e3 for a, b in self._events[:n])  # ms -> s
            del self._events[:n]

    def resolve(self) -> None:
        """Read the CUDA step events and the losses recorded so far (one device sync)."""
        self._take_losses(self._loss_reads.drain())
        self._read_events(keep=0)
        if self._pending_losses:
            self.losses.extend(torch.stack(self._pending_losses).tolist())
        self._pending_losses = []

    def curve_so_far(self) -> dict:
        """This rank's loss per optimizer step since the run's first (a checkpoint keeps it: one
        device read per checkpoint, not per step)."""
        self.resolve()
        return {"global_steps": self.prior["global_steps"] + self.global_steps,
                "losses": self.prior["losses"] + self.losses}

    def rank_summary(self) -> dict:
        """This rank's measurements, gathered to rank 0 after fit."""
        self.resolve()
        return {"step_times": self.step_times, "losses": self.losses, "global_steps": self.global_steps,
                "prior_curve": self.prior,
                "params": self.state.get("params", 0), "grads": self.grad_bytes,
                "optimizer": self.state.get("optimizer", 0), "host_flops": self.host_flops,
                **(self.peaks or read_peaks(torch.device("cpu")))}


def read_peaks(device: torch.device, read_device_memory=None) -> dict:
    """Peak host RSS of this process and, on a GPU, peak device memory of `device`: the rank's
    own device (the strategy's root_device; a module may already sit elsewhere). Device memory
    comes from `read_device_memory(device)` -> {"peak_allocated", "peak_reserved"} (default:
    the CUDA caching allocator's counters)."""
    out = {"peak_rss_bytes": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024}  # Linux: KiB
    if device.type == "cuda":
        mem = (read_device_memory or cuda_memory)(device)
        out["peak_device_bytes"] = int(mem["peak_allocated"])
        out["peak_device_reserved_bytes"] = int(mem["peak_reserved"])
    return out


def cuda_memory(device: torch.device) -> dict[str, int]:
    """Peak bytes the CUDA caching allocator handed out (max_memory_allocated) and held from the
    driver (max_memory_reserved) on `device` since the process started: model build, fit and
    everything in between, whatever module holds them."""
    return {"peak_allocated": torch.cuda.max_memory_allocated(device),
            "peak_reserved": torch.cuda.max_memory_reserved(device)}


def gather_all(obj: Any) -> list[Any]:
    """Every rank's obj, in rank order (a plain list when not distributed)."""
    if not (dist.is_available() and dist.is_initialized()):
        return [obj]
    out: list[Any] = [None] * dist.get_world_size()
    dist.all_gather_object(out, obj)
    return out


class HostLRMonitor(LearningRateMonitor):
    """Lightning's LearningRateMonitor, logging the same values, but its copies of them into
    trainer.callback_metrics are host tensors: Lightning makes them with
    `torch.tensor(lr, device=root_device)` every logged step, a blocking host->device copy (a
    stream sync) on CUDA."""

    def on_train_batch_start(self, trainer, pl_module, batch, batch_idx, *args, **kwargs) -> None:
        # Once per optimizer step: Lightning's logs it before every micro-batch, so k accumulated
        # micro-batches wrote k identical rows per step into metrics.csv and W&B.
        if batch_idx % max(1, trainer.accumulate_grad_batches) == 0:
            super().on_train_batch_start(trainer, pl_module, batch, batch_idx, *args, **kwargs)

    def _extract_stats(self, trainer, interval: str) -> dict[str, float]:
        return super()._extract_stats(_OnHost(trainer), interval)


class _OnHost:
    """A view of the trainer whose strategy's root_device is the CPU."""

    def __init__(self, trainer):
        self._trainer = trainer
        self.strategy = _HostStrategy(trainer.strategy)

    def __getattr__(self, name):
        return getattr(self._trainer, name)


class _HostStrategy:
    root_device = torch.device("cpu")

    def __init__(self, strategy):
        self._strategy = strategy

    def __getattr__(self, name):
        return getattr(self._strategy, name)

"""Per-rank measurements for the run record: step times, loss per optimizer step, memory.

Nothing here communicates during training; everything is gathered once, after fit
(gather_all), so the measurement does not perturb the communication it measures.
"""
from __future__ import annotations

import resource
import statistics
import time
from typing import Any

import lightning as L
import torch
import torch.distributed as dist


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


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
    def __init__(self, accumulate: int, plan: Any):
        self.accumulate, self.plan = accumulate, plan
        self.step_times: list[float] = []
        self.losses: list[float] = []
        self.global_steps: list[int] = []  # optimizer step numbers (continue after a resume)
        self._micro: list[torch.Tensor] = []
        self._t_last = 0.0
        self.grad_bytes = 0
        self.state: dict[str, int] = {}
        self.host_flops: list[float] = []    # host_speed() at the start and end of training

    def on_train_start(self, trainer, pl_module) -> None:
        if pl_module.device.type == "cpu":
            self.host_flops.append(host_speed())
        _sync(pl_module.device)
        self._t_last = time.perf_counter()

    def on_train_end(self, trainer, pl_module) -> None:
        if pl_module.device.type == "cpu":
            self.host_flops.append(host_speed())

    def on_before_optimizer_step(self, trainer, pl_module, optimizer) -> None:
        if not self.grad_bytes:  # gradients exist only between backward and the optimizer step
            self.grad_bytes = self.plan.grad_bytes(trainer, pl_module)

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx) -> None:
        self._micro.append(outputs["raw_loss"])
        if len(self._micro) < self.accumulate:
            return
        _sync(pl_module.device)
        now = time.perf_counter()
        self.step_times.append(now - self._t_last)
        self._t_last = now
        # .item() syncs the device; on CPU it is free. Mean over micro-batches = this rank's step loss.
        self.losses.append(torch.stack(self._micro).float().mean().item())
        self.global_steps.append(trainer.global_step)
        self._micro = []
        if len(self.step_times) == 1:  # optimizer state exists after the first step
            self.state = self.plan.state_bytes(trainer, pl_module)

    def rank_summary(self, device: torch.device) -> dict:
        peak_rss = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024  # Linux: KiB
        out = {"step_times": self.step_times, "losses": self.losses, "global_steps": self.global_steps,
               "peak_rss_bytes": peak_rss,
               "params": self.state.get("params", 0), "grads": self.grad_bytes,
               "optimizer": self.state.get("optimizer", 0), "host_flops": self.host_flops}
        if device.type == "cuda":
            out["peak_device_bytes"] = torch.cuda.max_memory_allocated(device)
        return out


def gather_all(obj: Any) -> list[Any]:
    """Every rank's obj, in rank order (a plain list when not distributed)."""
    if not (dist.is_available() and dist.is_initialized()):
        return [obj]
    out: list[Any] = [None] * dist.get_world_size()
    dist.all_gather_object(out, obj)
    return out


def summarize(per_rank: list[dict], global_batch: int, tokens_per_sample: int | None,
              warmup_steps: int, loss_ranks: list[int] | None = None, profiled_steps: int = 0) -> dict:
    """Combine per-rank summaries into the run record's measured fields.

    A step ends when the slowest rank ends it, so the step time is the max over ranks.
    The loss per step is the mean over the ranks that compute it (all, unless a pipeline's
    last stage alone does: loss_ranks)."""
    n_steps = min(len(r["step_times"]) for r in per_rank)
    step = [max(r["step_times"][i] for r in per_rank) for i in range(n_steps)]
    # Steady state: without the warm-up steps, and without the profiled steps (profiler overhead).
    timed = step[: n_steps - profiled_steps]
    steady = timed[warmup_steps:] if len(timed) > warmup_steps else timed[1:] or timed
    src = [per_rank[i] for i in (loss_ranks or range(len(per_rank)))]
    curve = [[per_rank[0]["global_steps"][i], statistics.fmean(r["losses"][i] for r in src)]
             for i in range(n_steps)]
    samples_per_s = global_batch * len(steady) / sum(steady) if steady else 0.0
    q = sorted(steady)
    return {
        "steps": n_steps,
        "throughput": {"samples_per_s": samples_per_s,
                       "tokens_per_s": samples_per_s * tokens_per_sample if tokens_per_sample else None},
        "step_time_s": {"median": statistics.median(q) if q else None,
                        "p90": q[min(len(q) - 1, int(0.9 * len(q)))] if q else None,
                        "mean": statistics.fmean(q) if q else None,
                        "measured_steps": len(q), "warmup_steps_excluded": min(warmup_steps, n_steps),
                        "profiled_steps_excluded": profiled_steps},
        "step_time_per_rank_s": [statistics.median(r["step_times"][warmup_steps:] or r["step_times"])
                                 for r in per_rank],
        "memory": {
            "peak_rss_bytes_per_rank": [r["peak_rss_bytes"] for r in per_rank],
            "model_state_bytes_per_rank": [r["params"] + r["grads"] + r["optimizer"] for r in per_rank],
            "model_state_breakdown_per_rank": [{k: r[k] for k in ("params", "grads", "optimizer")}
                                               for r in per_rank],
            **({"peak_device_bytes_per_rank": [r["peak_device_bytes"] for r in per_rank]}
               if "peak_device_bytes" in per_rank[0] else {}),
        },
        "loss": {"first": curve[0][1] if curve else None, "final": curve[-1][1] if curve else None,
                 "curve": curve},
        **({"host_speed": {
            "matmul_flops_per_rank": [statistics.fmean(r["host_flops"]) for r in per_rank],
            "flops": statistics.fmean(f for r in per_rank for f in r["host_flops"]),
            "method": "mean FLOP/s of fp32 256x256 torch.mm over 0.1 s, every rank at the start and "
                      "the end of training (scaling.metrics.host_speed)"}}
           if per_rank[0].get("host_flops") else {}),
    }

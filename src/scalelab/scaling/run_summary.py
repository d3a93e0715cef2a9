"""The run record's measured figures from every rank's StepMetrics summary (scaling.metrics):
step time (the slowest rank's), steady-state slice, throughput, loss curve, memory."""
from __future__ import annotations

import math
import statistics


def p90(sorted_values: list[float]) -> float | None:
    """90th percentile by the nearest-rank method: the smallest value with at least 90 % of the
    values at or below it (index ceil(0.9 n) - 1: the 9th of 10, not the maximum)."""
    if not sorted_values:
        return None
    return sorted_values[max(0, math.ceil(0.9 * len(sorted_values)) - 1)]


# Fewer steady steps than this and median/p90/throughput are not steady-state figures: the run
# record says so (short_run), the console warns and the comparison table marks the row.
MIN_MEASURED_STEPS = 5


def steady_slice(n_steps: int, warmup_steps: int, profiled_steps: int) -> tuple[int, int]:
    """[start, end) of the steady-state steps: without the warm-up steps at the start and the
    profiled steps at the end (profiler overhead). A run too short for its warm-up still drops
    its first step (it includes start-up work), unless that would leave nothing."""
    end = max(0, n_steps - profiled_steps)
    start = warmup_steps if end > warmup_steps else (1 if end > 1 else 0)
    return start, end


def loss_fields(curve: list) -> dict:
    """A record's `loss` from its curve ([[step, loss], ...]): first, final and the curve."""
    return {"first": curve[0][1] if curve else None, "final": curve[-1][1] if curve else None, "curve": curve}


def summarize(per_rank: list[dict], global_batch: int, tokens_per_sample: int | None,
              warmup_steps: int, loss_ranks: list[int] | None = None, profiled_steps: int = 0) -> dict:
    """Combine per-rank summaries into the run record's measured fields.

    The run goes as fast as its slowest rank: the step times are those of the rank whose steady
    steps took longest in all (each rank's own intervals; they sum to its elapsed time). The max
    over ranks of each step's interval, taken step by step, summed to more than any rank's
    elapsed time: the ranks' step boundaries jitter apart (rank 0 14 then 25 ms where rank 1 39
    then 15 ms), so a fast interval never cancelled a slow one and every N > 1 run was 1.5-4 %
    slower than it ran, its scaling efficiency and MFU low against a 1-rank baseline. The loss
    per step is the mean over the ranks that compute it (all, unless a pipeline's last stage
    alone does: loss_ranks)."""
    n_steps = min(len(r["step_times"]) for r in per_rank)
    start, end = steady_slice(n_steps, warmup_steps, profiled_steps)
    slowest = max(per_rank, key=lambda r: (sum(r["step_times"][start:end]), sum(r["step_times"][:n_steps])))
    step = slowest["step_times"][:n_steps]
    steady = step[start:end]
    src = [per_rank[i] for i in (loss_ranks or range(len(per_rank)))]
    curve = [[per_rank[0]["global_steps"][i], statistics.fmean(r["losses"][i] for r in src)]
             for i in range(n_steps)]
    # a resumed run: its steps before the checkpoint, as each rank recorded them then
    priors = [r.get("prior_curve") or {"global_steps": [], "losses": []} for r in src]
    n_prior = min(len(c["losses"]) for c in priors)
    first_now = curve[0][0] if curve else float("inf")
    curve = [[priors[0]["global_steps"][i], statistics.fmean(c["losses"][i] for c in priors)]
             for i in range(n_prior) if priors[0]["global_steps"][i] < first_now] + curve
    samples_per_s = global_batch * len(steady) / sum(steady) if steady else 0.0
    q = sorted(steady)
    return {
        "steps": n_steps,
        "short_run": len(q) < MIN_MEASURED_STEPS,
        "throughput": {"samples_per_s": samples_per_s,
                       "tokens_per_s": samples_per_s * tokens_per_sample if tokens_per_sample else None},
        "step_time_s": {"median": statistics.median(q) if q else None, "p90": p90(q),
                        "mean": statistics.fmean(q) if q else None,
                        "measured_steps": len(q), "warmup_steps_excluded": start,
                        "profiled_steps_excluded": n_steps - end},
        # Each rank's own steady steps (the same slice as the figures above).
        "step_time_per_rank_s": [statistics.median(r["step_times"][start:end] or r["step_times"])
                                 for r in per_rank],
        "memory": {
            "peak_rss_bytes_per_rank": [r["peak_rss_bytes"] for r in per_rank],
            "model_state_bytes_per_rank": [r["params"] + r["grads"] + r["optimizer"] for r in per_rank],
            "model_state_breakdown_per_rank": [{k: r[k] for k in ("params", "grads", "optimizer")}
                                               for r in per_rank],
            **({"peak_device_bytes_per_rank": [r["peak_device_bytes"] for r in per_rank],
                "peak_device_reserved_bytes_per_rank": [r["peak_device_reserved_bytes"] for r in per_rank],
                "device_memory_method": "torch.cuda.max_memory_allocated / max_memory_reserved of each "
                                        "rank's own device, since process start"}
               if "peak_device_bytes" in per_rank[0] else {}),
            # the same counter per phase of one steady step (scaling/phase_memory.py)
            **({"peak_device_bytes_by_phase_per_rank": [r["peak_device_bytes_by_phase"] for r in per_rank]}
               if all(r.get("peak_device_bytes_by_phase") for r in per_rank) else {}),
        },
        "loss": loss_fields(curve),
        **({"host_speed": {
            "matmul_flops_per_rank": [statistics.fmean(r["host_flops"]) for r in per_rank],
            "flops": statistics.fmean(f for r in per_rank for f in r["host_flops"]),
            "method": "mean FLOP/s of fp32 256x256 torch.mm over 0.1 s, every rank at the start and "
                      "the end of training (scaling.metrics.host_speed)"}}
           if per_rank[0].get("host_flops") else {}),
    }

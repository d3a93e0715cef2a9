"""run.json's `pipeline` entry for `pipeline` and `nd` (a mixin of pipeline.Pipeline, apart to keep
pipeline.py short): each rank's per-step timings turned into the measured bubble per stage, next
to the prediction, and the stage split (layers per stage and their modelled cost)."""
from __future__ import annotations

import math
import statistics
import time
from typing import Any

from scalelab.strategies.pipeline_split import layer_counts, layer_ranges, modelled_costs

_BUBBLE_METHOD = ("per rank and optimizer step: idle = time of the schedule step minus the time in the "
                  "stage's own forward_one_chunk/backward_one_chunk calls and the loss (CUDA: intervals between "
                  "events recorded on the stream around each, read two steps later; CPU: perf_counter); "
                  "bubble = idle / compute, idle_fraction = idle / step; mean over steady steps (warm-up "
                  "and profiled steps excluded), then over ranks")


class StageTimer:
    """Per optimizer step, the time of the schedule step and the time inside the stage's own compute
    calls (`wrap`), for the measured bubble.

    On CUDA the bounds are events recorded on the current stream and read LAG_STEPS later, waiting
    on those old events only: the stream reaches a call's start event after the waits for its
    received activations were queued before it, so the interval is the call's device time, and
    no device queue is drained (issue 11: it used to synchronize the device before and after every
    call, 4 m + 2 drains per step, which measured the schedule under a load it does not have). Off
    CUDA, perf_counter around the calls (gloo's receives block the host, so host time is the time)."""

    def __init__(self, device: Any, event: Any = None):
        self.cuda = device.type == "cuda"
        self.lag, self._event = 0, None
        if self.cuda:  # imported here: the plan modules load in the launcher, which has no Lightning
            from scalelab.scaling.metrics import LAG_STEPS, record_event

            self.lag, self._event = LAG_STEPS, event or (lambda: record_event(device))
        self.step_s: list[float] = []
        self.busy_s: list[float] = []
        self._pending: list = []   # CUDA: [start event, [(e0, e1) ...], end event] per step
        self._cur: Any = None

    def start_step(self) -> None:
        self._cur = [self._event(), [], None] if self.cuda else [time.perf_counter(), 0.0]

    def wrap(self, fn):
        def run(*args, **kwargs):
            if not self.cuda:
                t0 = time.perf_counter()
                out = fn(*args, **kwargs)
                self._cur[1] += time.perf_counter() - t0
                return out
            e0 = self._event()
            out = fn(*args, **kwargs)
            self._cur[1].append((e0, self._event()))
            return out
        return run

    def end_step(self) -> None:
        if not self.cuda:
            self.step_s.append(time.perf_counter() - self._cur[0])
            self.busy_s.append(self._cur[1])
            return
        self._cur[2] = self._event()
        self._pending.append(self._cur)
        self._resolve(keep=self.lag)

    def results(self) -> tuple[list[float], list[float]]:
        """Every step's (step_s, busy_s) so far (CUDA: waits for the last step's end event)."""
        self._resolve(keep=0)
        return self.step_s, self.busy_s

    def _resolve(self, keep: int) -> None:
        while len(self._pending) > keep:
            start, calls, end = self._pending.pop(0)
            end.synchronize()   # an old step's event: newer steps stay queued on the device
            self.step_s.append(start.elapsed_time(end) / 1e3)             # ms -> s
            self.busy_s.append(sum(a.elapsed_time(b) for a, b in calls) / 1e3)


class PipelineRecord:
    """Needs from the plan: microbatches, dp, schedule, split, stages_per_rank, _pp_degree(),
    and inside a rank _stage_idx, _timer (StageTimer), _n_layers, _counts, _cfg."""

    def rank_metrics(self) -> dict:
        """This rank's per-step pipeline timings (gathered to rank 0 after fit)."""
        step_s, busy_s = self._timer.results() if self._timer is not None else ([], [])
        return {"stage": self._stage_idx, "step_s": list(step_s), "busy_s": list(busy_s)}

    def record_fields(self, per_rank: list[dict], warmup_steps: int, profiled_steps: int = 0) -> dict:
        """run.json's `pipeline` entry from every rank's rank_metrics()."""
        p, m, v = self._pp_degree(len(per_rank)), self.microbatches, self.stages_per_rank
        bubble_stage: dict[int, list[float]] = {}
        idle_stage: dict[int, list[float]] = {}
        for r in per_rank:
            n = len(r["step_s"]) - profiled_steps
            steps = list(zip(r["step_s"], r["busy_s"]))[:max(n, 0)]
            steady = steps[warmup_steps:] if len(steps) > warmup_steps else steps[1:] or steps
            idle = [max(s - b, 0.0) for s, b in steady]
            bubble_stage.setdefault(r["stage"], []).append(
                statistics.fmean(i / b for i, (_, b) in zip(idle, steady)) if steady else math.nan)
            idle_stage.setdefault(r["stage"], []).append(
                statistics.fmean(i / s for i, (s, _) in zip(idle, steady)) if steady else math.nan)
        idle_per_stage = [statistics.fmean(idle_stage[s]) for s in sorted(idle_stage)]
        bubble_per_stage = [statistics.fmean(bubble_stage[s]) for s in sorted(bubble_stage)]
        return {"pipeline": {
            "schedule": self.schedule, "microbatches": m, "stages": p, "dp": self.dp, "stages_per_rank": v,
            # bubble = idle time / compute time; (p-1)/m for GPipe and 1F1B with equal stages,
            # (p-1)/(v m) interleaved (Narayanan et al. 2021, Sec. 2.2.2)
            "bubble_predicted": (p - 1) / (v * m),
            "bubble_measured": statistics.fmean(bubble_per_stage),
            # the same as a fraction of the step: (p-1)/(m+p-1)
            "idle_fraction_predicted": (p - 1) / (v * m + p - 1),
            "idle_fraction_measured": statistics.fmean(idle_per_stage),
            "idle_fraction_per_stage": idle_per_stage,
            "bubble_per_stage": bubble_per_stage,
            **self.split_fields(p),
            "method": _BUBBLE_METHOD,
        }}

    def split_fields(self, p: int) -> dict:
        """The split for run.json: layers per pipeline rank (stage), per virtual stage, and the
        modelled forward FLOPs per token of each rank's layers (pipeline_split.py), next to which
        bubble_per_stage shows what the split did."""
        counts = self._counts or layer_counts(self._n_layers, p * self.stages_per_rank) if self._n_layers else []
        if not counts:
            return {"split": self.split, "layers_per_stage": None}
        per_rank = [sum(counts[r + k * p] for k in range(self.stages_per_rank)) for r in range(p)]
        out = {"split": self.split, "layers_per_stage": per_rank,
               "stage_layers": [sum((layer_ranges(counts)[r + k * p] for k in range(self.stages_per_rank)), [])
                                for r in range(p)]}
        if self.stages_per_rank > 1:
            out["layers_per_virtual_stage"] = counts
        if self._cfg is not None:
            costs = modelled_costs(counts, self._cfg)
            out["modelled_fwd_flops_per_stage"] = [sum(costs[r + k * p] for k in range(self.stages_per_rank))
                                                         for r in range(p)]
        return out

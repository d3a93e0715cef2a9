"""run.json's `pipeline` entry for `pipeline` and `nd` (a mixin of pipeline.Pipeline, apart to keep
pipeline.py short): each rank's per-step timings turned into the measured bubble per stage, next
to the prediction, and the stage split (layers per stage and their modelled cost)."""
from __future__ import annotations

import math
import statistics

from scalelab.strategies.pipeline_split import layer_counts, layer_ranges, modelled_costs

_BUBBLE_METHOD = ("per rank and optimizer step: idle = wall time of the schedule step minus the time in the "
                  "stage's own forward_one_chunk/backward_one_chunk calls and the loss (CUDA synchronized around "
                  "each); bubble = idle / compute, idle_fraction = idle / step; mean over steady steps (warm-up "
                  "and profiled steps excluded), then over ranks")


class PipelineRecord:
    """Needs from the plan: microbatches, dp, schedule, split, stages_per_rank, _pp_degree(),
    and inside a rank _stage_idx, _step_s, _busy_s, _n_layers, _counts, _cfg."""

    def rank_metrics(self) -> dict:
        """This rank's per-step pipeline timings (gathered to rank 0 after fit)."""
        return {"stage": self._stage_idx, "step_s": list(self._step_s), "busy_s": list(self._busy_s)}

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

"""Host floors of a GPU profile, fitted from runs (`scalelab plan --calibrate` on GPU sweeps).

A GPU step cannot be shorter than the time the host takes to issue it. Where a strategy's
hooks and per-tensor bookkeeping (FSDP2, DeepSpeed) take longer than the device's kernels, the
device idles and the step is the host's time (step_time.step_time: step = max(device-bound
step, strategy_host_layer_s[strategy] x layers x micro-batches)). That is not linear in the
calibration's features, and a host-bound run fitted as if it were would drag the device rates
(compute efficiency, overheads) towards it, mispredicting every device-bound run.

So, on a GPU profile: fit the linear terms, call the runs the fit predicts more than
HOST_BOUND_MARGIN too fast host-bound, refit on the others, and repeat until the split is
stable; each strategy's floor per layer x micro-batch is then the median over its host-bound
runs of measured step / (layers x micro-batches). A strategy measured in the sweep with no
host-bound run loses any floor the base profile had (it was not host-bound at these sizes);
strategies the sweep did not run keep theirs. CPU profiles have no floor: a CPU rank computes
on the host, so its own Python time is part of the measured step the linear terms fit.
"""
from __future__ import annotations

import statistics
from dataclasses import replace
from typing import Callable

from .hardware import Hardware
from .step_time import Terms, host_floor_units, step_time

HOST_BOUND_MARGIN = 0.10   # a run measured > 1.10 x its device-bound prediction is host-bound
MAX_ROUNDS = 5


def split_host_bound(terms: list[Terms], times: list[float], fit: Callable[[list[int]], Hardware],
                     margin: float = HOST_BOUND_MARGIN) -> tuple[Hardware, list[int]]:
    """(the profile fitted on the device-bound runs, indexes of the host-bound runs).
    fit(indexes) fits the linear terms to those runs only."""
    keep = list(range(len(terms)))
    hw = fit(keep)
    for _ in range(MAX_ROUNDS):
        bound = [i for i, (t, meas) in enumerate(zip(terms, times))
                 if meas > (1 + margin) * step_time(t, replace(hw, strategy_host_layer_s={}))["step_s"]]
        new_keep = [i for i in range(len(terms)) if i not in bound]
        if new_keep == keep or not new_keep:
            return hw, [i for i in range(len(terms)) if i not in keep]
        keep = new_keep
        hw = fit(keep)
    return hw, [i for i in range(len(terms)) if i not in keep]


def fitted_floors(terms: list[Terms], times: list[float], host_bound: list[int],
                  base: dict[str, float]) -> dict[str, float]:
    """strategy_host_layer_s from the host-bound runs (module docstring)."""
    per: dict[str, list[float]] = {}
    for i in host_bound:
        per.setdefault(terms[i].strategy.name, []).append(times[i] / host_floor_units(terms[i]))
    measured = {t.strategy.name for t in terms}
    kept = {k: v for k, v in base.items() if k not in measured}
    return {**kept, **{s: float(statistics.median(v)) for s, v in sorted(per.items())}}

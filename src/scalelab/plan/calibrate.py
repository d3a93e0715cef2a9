"""Fit a hardware profile to measured runs (--calibrate; --validate is validate.py).

Each job dir of a sweep holds a `run.json` (DESIGN.md, run record contract). The step-time model of
step_time.py is linear in a handful of physical rates, so calibration is a least-squares fit:

    t_measured ~= overhead + strategy_overhead[s]
                  + m x (micro_overhead + layers x (layer_overhead + strategy_layer_overhead[s]))
                  + compute_flops / (peak x efficiency[dtype@threads])
                  + activation_bytes / activation_bw + optimizer_bytes / memory_bw
                  + sum over collective types op: bus_bytes[op] / bw[op] + ring_hops[op] x latency[op]

The measured times are first brought to the profile's reference host speed with each run's own
matmul probe (`speed_factor`, run_records.py): this VM's speed drifts by up to 1.5x over an hour.
Rows are divided by the measured time (we minimise relative error, which is how --validate
judges), the unknowns are constrained >= 0 (non-negative least squares, Lawson & Hanson 1974), and
a weak pull towards the prior profile keeps rates the sweep cannot separate (e.g. bandwidth vs
latency when every run moves the same buffers) at physically sensible values instead of 0 or inf.
Each collective type gets its own bandwidth and latency (a backend implements each with its own
algorithm: gloo has no native reduce-scatter), as nccl-tests reports a busbw per collective. A
strategy gets its own per-layer term with >= 3 runs at >= 2 layer x micro-batch counts ("single",
plain Lightning, has the base terms only), so each such term is over-determined;
the report also gives leave-one-out ratios (each run predicted by the profile a fit that did not
see it would save). A fit of fewer runs than its terms + 1 (or without leave-one-out) cannot pin
its rates down (the non-negative fit with its pull to the prior need not even match those runs):
it is saved with `calibration.underdetermined: true`. Runs must have run
on the profile's kind of device (CPU / GPU), and a CPU profile records its host's key.
Compute gets one rate per (dtype, threads per rank) seen: on CPU, 2 threads are not twice 1, and
bf16 may have no fast kernel (see this_cpu.yaml's probe).
Memory: on CPU runs the profile's runtime_memory_bytes becomes the median of peak RSS minus what
the planner puts in RAM for the model (runtime_bytes_from_rss); model states need no fit.
"""
from __future__ import annotations

import datetime as _dt
import math
from dataclasses import replace
from pathlib import Path

import numpy as np

from .hardware import CALIBRATED_HEADER, Hardware, Link, _cpu_name, _host_key, _usable_cores, save_hardware
from .spec import conf_dir
from .host_floor import fitted_floors, split_host_bound
from .run_records import (SPEED_WINDOW, as_dirs, check_accelerators, measured, runtime_bytes_from_rss,
                          speed_factor, usable_runs)
from .step_time import busy_per_node, linear_features, step_time, theta_of

BASE_STRATEGIES = ("single",)
PRIOR_WEIGHT = 1e-4          # pull of a rate towards its prior, relative to one run's squared error
FIT_STRATEGY_STEP_OVERHEAD = False
SLOWDOWN_GRID = np.arange(1.0, 2.5001, 0.025)   # busy_slowdown candidates


# --------------------------------------------------------------------------------------------
# Fitting
# --------------------------------------------------------------------------------------------
def nnls(A: np.ndarray, b: np.ndarray, max_iter: int = 500) -> np.ndarray:
    """min ||A x - b|| subject to x >= 0 (Lawson & Hanson, "Solving Least Squares Problems", ch. 23)."""
    n = A.shape[1]
    x, passive = np.zeros(n), np.zeros(n, dtype=bool)
    w = A.T @ (b - A @ x)
    for _ in range(max_iter):
        if passive.all() or w[~passive].max(initial=-np.inf) <= 1e-12:
            break
        j = np.argmax(np.where(passive, -np.inf, w))
        passive[j] = True
        while True:
            z = np.zeros(n)
            z[passive] = np.linalg.lstsq(A[:, passive], b, rcond=None)[0]
            if (z[passive] > 0).all():
                x = z
                break
            neg = passive & (z <= 0)
            alpha = np.min(x[neg] / (x[neg] - z[neg]))
            x = x + alpha * (z - x)
            passive &= x > 1e-15
        w = A.T @ (b - A @ x)
    return x


def fit(rows: list[dict[str, float]], times: list[float], prior: dict[str, float],
        prior_weight: float = PRIOR_WEIGHT) -> dict[str, float]:
    """Non-negative relative least squares of times ~ sum(theta_k x_k).

    Unknowns are scaled by their prior value (overheads by the median step time) so the columns are
    comparable; the other columns (compute, memory, links, per-micro-batch and per-layer overheads)
    get a weak pull towards the prior, which only matters where the runs cannot tell two terms
    apart (e.g. per-step vs per-micro-batch cost when no run accumulates). The per-step and
    per-strategy overheads get none.
    """
    cols = sorted({k for r in rows for k, v in r.items() if v != 0.0})
    t_med = float(np.median(times))
    free = [k for k in cols if k == "overhead" or k.startswith(("strategy:", "strategy_layer:"))]
    scale = {k: (t_med if k in free else (prior.get(k) or t_med)) for k in cols}
    A = np.array([[r.get(k, 0.0) * scale[k] / t for k in cols] for r, t in zip(rows, times)])
    b = np.ones(len(rows))
    pulled = [i for i, k in enumerate(cols) if k not in free]
    if pulled:
        lam = math.sqrt(prior_weight)
        P = np.zeros((len(pulled), len(cols)))
        P[np.arange(len(pulled)), pulled] = lam
        A = np.vstack([A, P])
        b = np.concatenate([b, [lam * prior.get(cols[i], 0.0) / scale[cols[i]] for i in pulled]])
    u = nnls(A, b)
    return {k: float(u[i] * scale[k]) for i, k in enumerate(cols)}


def apply_theta(hw: Hardware, theta: dict[str, float], name: str) -> Hardware:
    """A copy of `hw` with the fitted terms; terms the sweep did not exercise keep the prior. A rate
    whose time the fit drove to 0 becomes .inf (its term was negligible in every run)."""
    def rate(key, old):
        if key not in theta:
            return old
        return 1 / theta[key] if theta[key] > 0 else math.inf
    strat = dict(hw.strategy_overhead_s)
    strat_layer = dict(hw.strategy_layer_overhead_s)
    by = dict(hw.compute_efficiency_by)
    colls = {op: dict(v) for op, v in hw.collectives.items()}
    for k, v in theta.items():
        kind, _, key = k.partition(":")
        if kind == "strategy":
            strat[key] = v
        elif kind == "strategy_layer":
            strat_layer[key] = v
        elif kind == "compute" and key and v > 0:
            by[key] = 1 / v
        elif kind in ("intra_bw", "intra_lat") and key:
            link = hw.link(False, key)
            d = colls.setdefault(key, {"bandwidth_bytes_per_s": link.bandwidth_bytes_per_s,
                                       "latency_s": link.latency_s})
            if kind == "intra_bw":
                d["bandwidth_bytes_per_s"] = 1 / v if v > 0 else math.inf
            else:
                d["latency_s"] = v
    # The generic efficiency (for dtypes / thread counts not measured): one device's fp32 rate.
    generic = by.get(f"fp32@{hw.threads_per_device}", by[min(by)] if by else None)
    if "compute" in theta and theta["compute"] > 0:
        generic = 1 / theta["compute"]
    host = dict(hw.host)
    host["link_bandwidth_bytes_per_s"] = rate("host_link", host["link_bandwidth_bytes_per_s"])
    host["memory_bandwidth_bytes_per_s"] = rate("host_memory", host["memory_bandwidth_bytes_per_s"])
    return replace(
        hw, name=name, step_overhead_s=theta.get("overhead", hw.step_overhead_s),
        micro_batch_overhead_s=theta.get("micro_overhead", hw.micro_batch_overhead_s),
        layer_overhead_s=theta.get("layer_overhead", hw.layer_overhead_s),
        strategy_overhead_s=strat, strategy_layer_overhead_s=strat_layer, collectives=colls,
        compute_efficiency_by=by,
        compute_efficiency=generic or hw.compute_efficiency,
        memory_bandwidth_bytes_per_s=rate("memory", hw.memory_bandwidth_bytes_per_s),
        bubble_scale=theta.get("bubble", hw.bubble_scale),
        activation_bandwidth_bytes_per_s=rate("act_memory", hw.activation_bandwidth),
        intra_node=Link(rate("intra_bw", hw.intra_node.bandwidth_bytes_per_s),
                        theta.get("intra_lat", hw.intra_node.latency_s)),
        inter_node=Link(rate("inter_bw", hw.inter_node.bandwidth_bytes_per_s),
                        theta.get("inter_lat", hw.inter_node.latency_s)),
        host=host)


def _rows(runs, hw: Hardware) -> tuple[list[dict[str, float]], dict[str, float]]:
    """Feature rows of the runs under `hw` (its slowdown applied) and the prior rates."""
    rows = [linear_features(terms, hw, split=True) for _, _, terms in runs]
    counts: dict[str, int] = {}
    for _, _, t in runs:
        counts[t.strategy.name] = counts.get(t.strategy.name, 0) + 1
    # A strategy's own cost per layer x micro-batch needs >= 3 runs of it at >= 2 different counts;
    # otherwise the term could only echo one run. Its own per-step cost is not fitted: on the
    # 66-run CPU sweep it cut the in-sample error by 3 points but made leave-one-out 9 points worse
    # (0.39 vs 0.30 worst), i.e. it fitted noise (a profile may still set strategy_overhead_s).
    for s in counts:
        mine = [x for x, (_, _, t) in zip(rows, runs) if t.strategy.name == s]
        own_step = FIT_STRATEGY_STEP_OVERHEAD and s not in BASE_STRATEGIES and counts[s] >= 2
        own_layer = (s not in BASE_STRATEGIES and counts[s] >= 3
                     and len({x[f"strategy_layer:{s}"] for x in mine}) >= 2)
        for x in mine:
            if not own_step:
                x.pop(f"strategy:{s}")
            if not own_layer:
                x.pop(f"strategy_layer:{s}")
    prior = theta_of(hw)
    for x in rows:      # a rate the prior lacks starts at the generic one (compute, intra link)
        for k in x:
            if k not in prior and ":" in k and k.split(":")[0] in ("compute", "intra_bw", "intra_lat"):
                prior[k] = prior[k.split(":")[0]]
    return rows, prior


def _fit_error(runs, times, hw: Hardware) -> float:
    """Sum of squared relative errors of the least-squares fit under `hw`."""
    rows, prior = _rows(runs, hw)
    theta = fit(rows, times, prior)
    return sum((sum(theta.get(k, 0.0) * v for k, v in x.items()) / t - 1) ** 2
               for x, t in zip(rows, times))


def calibrate(sweep_dir, base: Hardware, out_path=None,
              speed_window: int = SPEED_WINDOW) -> tuple[Hardware, dict]:
    """Fit `base` to the runs under `sweep_dir`; write the profile to out_path (if given)."""
    runs, skipped = usable_runs(sweep_dir, speed_window)      # PlanError when none is usable
    check_accelerators(runs, base, "--calibrate")
    # Fit the step times the runs would have taken at the profile's reference host speed.
    times = [measured(run)["step_s"] * speed_factor(run, t, base) for _, run, t in runs]
    # Devices sharing a node slow each other (busy_slowdown): a factor on the whole step, so it
    # is found by a 1-D search around the least-squares fit, and only when the sweep also has
    # runs of a device alone (otherwise the rates absorb it).
    busy = {busy_per_node(t) for _, _, t in runs}
    slowdown = dict(base.busy_slowdown)
    if 1 in busy:
        for n in sorted(busy - {1}):
            best = min(SLOWDOWN_GRID, key=lambda f: _fit_error(
                runs, times, replace(base, busy_slowdown={**slowdown, str(n): float(f)})))
            slowdown[str(n)] = round(float(best), 3)
    base = replace(base, busy_slowdown=slowdown)
    name = Path(out_path).stem if out_path else f"{base.name}_calibrated"
    fitted: dict = {}

    def fit_runs(sel: list[int]) -> Hardware:
        sub, sub_t = [runs[i] for i in sel], [times[i] for i in sel]
        rows, prior = _rows(sub, base)
        theta = fit(rows, sub_t, prior)
        hw = apply_theta(base, theta, name)
        if any(x.get("bubble") for x in rows):
            # The bubble feature is priced at the profile's compute rates: refit once at the fitted ones.
            rows = _rows(sub, hw)[0]
            theta = fit(rows, sub_t, prior)
            hw = apply_theta(base, theta, name)
        fitted.update(sel=sel, rows=rows, prior=prior, theta=theta)
        return hw

    all_terms = [t for _, _, t in runs]
    host_bound: list[int] = []
    if base.kind == "cpu":
        hw = fit_runs(list(range(len(runs))))
    else:   # GPU: host-bound runs get a floor, not the device rates (plan/host_floor.py)
        hw, host_bound = split_host_bound(all_terms, times, fit_runs)   # its last fit: the device-bound runs
        hw = replace(hw, strategy_host_layer_s=fitted_floors(all_terms, times, host_bound,
                                                             base.strategy_host_layer_s))
    theta, prior, sel = fitted["theta"], fitted["prior"], fitted["sel"]
    rows = dict(zip(sel, fitted["rows"]))
    # Memory: the profile's runtime allowance (a prior: 350 MB on this_cpu) was below a Lightning
    # rank's real baseline (predicted / measured peak RSS 0.54-0.65 in outputs/plan_validation_b20).
    runtime = runtime_bytes_from_rss(runs)
    if runtime:
        hw = replace(hw, runtime_memory_bytes=round(runtime[0], -6))
    report = []
    for i, ((path, run, terms), t) in enumerate(zip(runs, times)):
        pred = step_time(terms, hw)["step_s"]     # both at reference speed: same ratio as measured
        # Leave-one-out: refit without this run, then predict it. In-sample ratios flatter the
        # model; these say how it does on a run it has not seen.
        # (A host-bound run is predicted by its floor: no leave-one-out of the linear terms.)
        # Predicted by the profile that fit would save (apply_theta: a compute rate fitted to 0
        # keeps the generic efficiency), as `pred` is: the raw theta's sum (a free matmul) called
        # such bf16 runs right (1.00) where the saved profile predicted them 50x too slow.
        loo = None
        if len(rows) > 2 and i in rows:
            others = [j for j in sel if j != i]
            th = fit([rows[j] for j in others], [times[j] for j in others], prior)
            loo_hw = replace(apply_theta(base, th, name), strategy_host_layer_s=hw.strategy_host_layer_s)
            loo = step_time(terms, loo_hw)["step_s"] / t
        report.append({"run": str(path.parent), "strategy": terms.strategy.name,
                       "world_size": terms.layout.world, "measured_step_s": t,
                       "predicted_step_s": pred, "ratio": pred / t, "loo_ratio": loo,
                       "host_bound": i in host_bound})
    rel = [r["ratio"] - 1 for r in report]
    loo_rel = [r["loo_ratio"] - 1 for r in report if r["loo_ratio"] is not None]
    # Fewer runs than unknowns + 1 (or no leave-one-out) fit every run exactly whatever the rates:
    # 1 run gave rms 4e-16 with compute_efficiency at the prior's 0.3 (true 0.55). Flagged, not
    # refused: a GPU sweep's few device-bound runs and the tests' 4-run sweeps are such fits.
    underdetermined = len(sel) < len(theta) + 1 or not loo_rel
    hw.calibration = {
        "sweep_dir": " ".join(str(d.resolve()) for d in as_dirs(sweep_dir)), "base_profile": base.name,
        "date": _dt.datetime.now().strftime("%Y-%m-%d %H:%M"), "runs": len(runs),
        "skipped": len(skipped), "fitted_terms": sorted(theta),
        "underdetermined": underdetermined, "fitted_runs": len(sel),
        "rms_relative_error": float(np.sqrt(np.mean(np.square(rel)))),
        "max_relative_error": float(np.max(np.abs(rel))),
        "leave_one_out_max_relative_error": float(np.max(np.abs(loo_rel))) if loo_rel else None,
        "busy_slowdown": dict(hw.busy_slowdown),
        "runtime_memory": (f"median peak RSS minus predicted model bytes over {runtime[1]} CPU runs"
                           if runtime else "not fitted (no CPU run with a peak RSS): the base profile's"),
        "host_floors": ({s: f"{v:.3g} s per layer x micro-batch" for s, v in hw.strategy_host_layer_s.items()}
                        if base.kind != "cpu" else "none on a CPU profile"),
        "host_bound_runs": [str(runs[i][0].parent) for i in host_bound],
        "strategies_with_own_overhead": sorted(k.split(":", 1)[1] for k in theta if k.startswith("strategy:")),
        "strategies_with_own_layer_overhead": sorted(k.split(":", 1)[1] for k in theta
                                                     if k.startswith("strategy_layer:")),
    }
    if base.kind == "cpu":
        # a CPU profile's rates are this host's (this_cpu is keyed the same way): load_hardware
        # warns when it is used on another host
        hw.calibration.update(host_key=_host_key(), host=f"{_cpu_name()}, {_usable_cores()} cores")
    base_note = base.note.split(" || ", 1)[-1]
    hw.note = (f"Calibrated from {len(runs)} runs in {hw.calibration['sweep_dir']} on "
               f"{hw.calibration['date']} (base: {base.name}) || " + base_note)
    if out_path is not None:
        dirs = " ".join(str(d) for d in as_dirs(sweep_dir))
        save_hardware(hw, out_path, header=f"{CALIBRATED_HEADER} {dirs}`; use with --hardware {out_path}")
    return hw, {"profile": hw.to_dict(), "theta": theta, "runs": report,
                "skipped": [{"run": str(p), "reason": r} for p, r in skipped]}


def default_calibrated_path(base_name: str) -> Path:
    return conf_dir() / "hardware" / f"{base_name}_calibrated.yaml"

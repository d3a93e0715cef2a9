"""Fit a hardware profile to measured runs (--calibrate) and compare predictions with runs (--validate).

Each job dir of a sweep holds a `run.json` (DESIGN.md, run record contract). The step-time model of
step_time.py is linear in a handful of physical rates, so calibration is a least-squares fit:

    t_measured ~= overhead + strategy_overhead[s]
                  + m x (micro_overhead + layers x (layer_overhead + strategy_layer_overhead[s]))
                  + compute_flops / (peak x efficiency[dtype@threads])
                  + activation_bytes / activation_bw + optimizer_bytes / memory_bw
                  + sum over collective types op: bus_bytes[op] / bw[op] + ring_hops[op] x latency[op]

The measured times are first brought to the profile's reference host speed with each run's own
matmul probe (`speed_factor`): this VM's speed drifts by up to 1.5x over an hour.
Rows are divided by the measured time (we minimise relative error, which is how --validate
judges), the unknowns are constrained >= 0 (non-negative least squares, Lawson & Hanson 1974), and
a weak pull towards the prior profile keeps rates the sweep cannot separate (e.g. bandwidth vs
latency when every run moves the same buffers) at physically sensible values instead of 0 or inf.
Each collective type gets its own bandwidth and latency (a backend implements each with its own
algorithm: gloo has no native reduce-scatter), as nccl-tests reports a busbw per collective. A
strategy gets its own per-layer term with >= 3 runs at >= 2 layer x micro-batch counts ("single",
plain Lightning, has the base terms only), so each such term is over-determined;
the report also gives leave-one-out ratios (each run predicted by a fit that did not see it).
Compute gets one rate per (dtype, threads per rank) seen: on CPU, 2 threads are not twice 1, and
bf16 may have no fast kernel (see this_cpu.yaml's probe).
Memory: on CPU runs the profile's runtime_memory_bytes becomes the median of peak RSS minus what
the planner puts in RAM for the model (runtime_bytes_from_rss); model states need no fit.
"""
from __future__ import annotations

import datetime as _dt
import json
import math
from dataclasses import replace
from pathlib import Path

import numpy as np

from .hardware import Hardware, Link, save_hardware
from .spec import ModelSpec, PlanError, conf_dir, get_strategy
from .host_floor import fitted_floors, split_host_bound
from .step_time import Terms, build_terms, busy_per_node, linear_features, rank_threads, step_time, theta_of

BASE_STRATEGIES = ("single",)
PRIOR_WEIGHT = 1e-4          # pull of a rate towards its prior, relative to one run's squared error
FIT_STRATEGY_STEP_OVERHEAD = False
SLOWDOWN_GRID = np.arange(1.0, 2.5001, 0.025)   # busy_slowdown candidates
SPEED_WINDOW = 5             # host speed = median probe of the jobs within 5 of a run (smooth_host_speeds)


# --------------------------------------------------------------------------------------------
# Reading runs
# --------------------------------------------------------------------------------------------
def _dirs(sweep_dirs) -> list[Path]:
    return [Path(d) for d in ([sweep_dirs] if isinstance(sweep_dirs, (str, Path)) else sweep_dirs)]


def find_runs(sweep_dirs) -> list[tuple[Path, dict]]:
    """Every run.json under one sweep directory or several."""
    runs = []
    for root in _dirs(sweep_dirs):
        if not root.exists():
            raise PlanError(f"sweep directory {str(root)!r} does not exist")
        for p in sorted(root.rglob("run.json")):
            try:
                runs.append((p, json.loads(p.read_text())))
            except (OSError, json.JSONDecodeError) as exc:
                runs.append((p, {"status": "unreadable", "error": str(exc)}))
    if not runs:
        raise PlanError(f"no run.json under {', '.join(repr(str(d)) for d in _dirs(sweep_dirs))}")
    return runs


def _pipeline_microbatches(run: dict) -> int | None:
    par = run.get("parallel") or {}
    for key in ("microbatches", "n_microbatches", "num_microbatches", "chunks"):
        if par.get(key):
            return int(par[key])
    pipe = run.get("pipeline") or {}
    for key in ("n_microbatches", "microbatches", "chunks"):
        if pipe.get(key):
            return int(pipe[key])
    return None


def model_from_run(run: dict) -> ModelSpec:
    m = run.get("model") or {}
    kind = m.get("kind", "gpt")
    try:
        n = int(m["n_params"])
        layers = int(m.get("n_layers") or 1)
        hidden = int(m.get("d_model") or m.get("hidden") or (1 if kind == "mlp" else None))
    except (KeyError, TypeError, ValueError) as exc:
        raise PlanError(f"run.json model lacks n_params/n_layers/d_model: {m}") from exc
    if kind == "mlp":
        return ModelSpec(n, layers, hidden, 1, int(m.get("vocab_size") or 1), 1, kind="mlp")
    cfg = run.get("config") if isinstance(run.get("config"), dict) else {}
    arch = (cfg.get("model") or {}).get("arch") or {}            # the run's resolved model config
    dropout = float(arch.get("dropout") or m.get("dropout") or 0.0)
    # scalelab's GPT calls SDPA: flash / memory-efficient kernels, except that torch runs
    # dropout > 0 on CPU with the math kernel (s x s scores and mask stored).
    cpu = (run.get("hardware") or {}).get("accelerator") == "cpu"
    attention = m.get("attention") or ("math" if cpu and dropout > 0 else "flash")
    return ModelSpec(n, layers, hidden, int(m.get("n_heads") or 1), int(m.get("vocab_size") or 1),
                     int(m.get("seq_len") or 1), int(m.get("ffn_hidden") or 0), kind="gpt",
                     attention=attention, dropout=dropout)


def terms_from_run(run: dict) -> Terms:
    """The planner's view of a measured run (same code path as `scalelab plan`)."""
    name = run.get("strategy")
    options = ((run.get("config") or {}).get("strategy") or {}) if isinstance(run.get("config"), dict) else {}
    strategy = get_strategy(str(name), options)   # the run's own resolved strategy config wins
    par = run.get("parallel") or {}
    tp, pp = int(par.get("tp") or 1), int(par.get("pp") or 1)
    micro = int(run["per_device_batch_size"])
    accum = int(run.get("accumulate_grad_batches") or 1)
    m = accum
    if strategy.pipeline:
        # The per-rank batch is cut into pipeline micro-batches (notes/cpu-strategies.md: 4).
        chunks = _pipeline_microbatches(run) or 4
        if micro % chunks == 0:
            micro, m = micro // chunks, accum * chunks
    hw = run.get("hardware") or {}
    # Model what one rank does: `micro` samples per forward/backward, m of them per optimizer step
    # (the global batch follows as dp x micro x m).
    return build_terms(
        model_from_run(run), strategy, devices=int(run.get("devices_per_node") or run["world_size"]),
        nodes=int(run.get("num_nodes") or 1), tp=tp, pp=pp, micro_batch=micro, micro_batches=m,
        precision=run.get("precision", "32"), optimizer=run.get("optimizer", "adam"),
        activation_checkpointing=run.get("activation_checkpointing") or "none",  # older records: a bool
        # a CPU rank's threads are its device; a GPU rank's host threads are not (step_time.rank_threads)
        threads=int(hw.get("threads_per_rank") or 1) if hw.get("accelerator") == "cpu" else None,
        # scalelab's tp/fsdp_tp/nd shard the LayerNorm regions only with strategy.sequence_parallel
        sequence_parallel=bool(par.get("sequence_parallel", options.get("sequence_parallel", False))))


def measured(run: dict) -> dict:
    mem = run.get("memory") or {}
    ms = mem.get("model_state_bytes_per_rank") or []
    rss = mem.get("peak_rss_bytes_per_rank") or []
    return {"step_s": float((run.get("step_time_s") or {}).get("median") or 0.0),
            "model_states_bytes": max(ms) if ms else None,
            "peak_rss_bytes": max(rss) if rss else None}


def model_bytes_in_ram(terms: Terms) -> float:
    """What the planner puts in a CPU rank's RAM besides the runtime: model states (offloaded ones
    too: on CPU, host and device are one RAM), activations and communication buffers."""
    st = terms.states
    return st.total_bytes + st.offloaded_bytes + terms.activations_bytes + st.resident_buffer_bytes(cpu=True)


def runtime_bytes_from_rss(runs) -> tuple[float, int] | None:
    """A CPU rank's runtime memory (interpreter, torch, Lightning, DeepSpeed): median over the CPU
    runs of peak RSS minus model_bytes_in_ram, and how many runs that is. None without CPU runs:
    a GPU run's RSS is host memory, not the device memory runtime_memory_bytes stands for."""
    extra = []
    for _, run, terms in runs:
        rss = measured(run)["peak_rss_bytes"]
        if rss and (run.get("hardware") or {}).get("accelerator") == "cpu":
            extra.append(rss - model_bytes_in_ram(terms))
    return (float(np.median(extra)), len(extra)) if extra else None


def speed_factor(run: dict, terms: Terms, hw: Hardware) -> float:
    """How fast the host ran during this run relative to the profile's reference: the matmul
    probe (run.json `host_speed`, measured by every rank at the start and end of training), as
    smoothed by `smooth_host_speeds`, over the profile's fp32 peak for its threads. Step times
    are predicted at the reference speed and divided by this. 1 for runs without a probe (GPU
    runs; records from before the probe)."""
    flops = run.get("_host_flops_smoothed") or (run.get("host_speed") or {}).get("flops")
    if not flops or hw.kind != "cpu":   # a host matmul probe says nothing of a GPU's speed
        return 1.0
    return float(flops) / (hw.peak("fp32") * rank_threads(terms, hw) / hw.threads_per_device)


def smooth_host_speeds(runs: list[tuple[Path, dict, Terms]], window: int = SPEED_WINDOW) -> None:
    """Give each run the median probe of the runs of its sweep within `window` jobs of it (job
    numbers are launch order), in run["_host_flops_smoothed"]; window 0 keeps each run's own.

    Why: one probe is 0.2 s of matmuls per rank, a run's step time a median over ~20 steps; on
    this VM the probe is the noisier of the two (measured in outputs/plan_validation: ddp gpt_mini
    took 0.115 / 0.130 / 0.121 s in three seeds while their probes read 0.75 / 0.99 / 0.72 of
    reference). The host's drift it is there to catch is slow (tens of % over an hour), so the
    median over neighbouring jobs keeps the drift and drops the probe's own noise."""
    if window <= 0:
        return
    by_sweep: dict[tuple, list[tuple[int, dict]]] = {}
    for path, run, terms in runs:
        job = run.get("job") or {}
        flops = (run.get("host_speed") or {}).get("flops")
        # Multirun jobs only (a plain run has no sweep_dir, and its num says nothing of time);
        # probes of different thread counts measure different things.
        if flops and job.get("sweep_dir") and job.get("num") is not None:
            key = (str(job["sweep_dir"]), terms.threads)
            by_sweep.setdefault(key, []).append((int(job["num"]), run))
    for members in by_sweep.values():
        for num, run in members:
            near = [r["host_speed"]["flops"] for n, r in members if abs(n - num) <= window]
            run["_host_flops_smoothed"] = float(np.median(near))


def usable_runs(sweep_dir, speed_window: int = SPEED_WINDOW
                ) -> tuple[list[tuple[Path, dict, Terms]], list[tuple[Path, str]]]:
    ok, skipped = [], []
    for path, run in find_runs(sweep_dir):
        if run.get("status") != "completed":
            skipped.append((path, f"status {run.get('status')!r}"))
            continue
        if measured(run)["step_s"] <= 0:
            skipped.append((path, "no step_time_s.median"))
            continue
        try:
            ok.append((path, run, terms_from_run(run)))
        except (PlanError, KeyError, TypeError, ValueError) as exc:
            skipped.append((path, str(exc)))
    smooth_host_speeds(ok, speed_window)
    return ok, skipped


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
    runs, skipped = usable_runs(sweep_dir, speed_window)
    if not runs:
        raise PlanError(f"no completed run with a step time under {', '.join(map(str, _dirs(sweep_dir)))} "
                        f"({len(skipped)} skipped)")
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
        loo = None
        if len(rows) > 2 and i in rows:
            others = [j for j in sel if j != i]
            th = fit([rows[j] for j in others], [times[j] for j in others], prior)
            loo = sum(th.get(k, prior.get(k, 0.0)) * v for k, v in rows[i].items()) / t
        report.append({"run": str(path.parent), "strategy": terms.strategy.name,
                       "world_size": terms.layout.world, "measured_step_s": t,
                       "predicted_step_s": pred, "ratio": pred / t, "loo_ratio": loo,
                       "host_bound": i in host_bound})
    rel = [r["ratio"] - 1 for r in report]
    loo_rel = [r["loo_ratio"] - 1 for r in report if r["loo_ratio"] is not None]
    hw.calibration = {
        "sweep_dir": " ".join(str(d.resolve()) for d in _dirs(sweep_dir)), "base_profile": base.name,
        "date": _dt.datetime.now().strftime("%Y-%m-%d %H:%M"), "runs": len(runs),
        "skipped": len(skipped), "fitted_terms": sorted(theta),
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
    base_note = base.note.split(" || ", 1)[-1]
    hw.note = (f"Calibrated from {len(runs)} runs in {hw.calibration['sweep_dir']} on "
               f"{hw.calibration['date']} (base: {base.name}) || " + base_note)
    if out_path is not None:
        dirs = " ".join(str(d) for d in _dirs(sweep_dir))
        save_hardware(hw, out_path, header=f"# Fitted by `scalelab plan --calibrate {dirs}`; "
                                           f"use with --hardware {out_path}")
    return hw, {"profile": hw.to_dict(), "theta": theta, "runs": report,
                "skipped": [{"run": str(p), "reason": r} for p, r in skipped]}


def default_calibrated_path(base_name: str) -> Path:
    return conf_dir() / "hardware" / f"{base_name}_calibrated.yaml"

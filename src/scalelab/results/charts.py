"""The dashboard's chart data, as plain functions of run records (and sweep.aggregate summaries):
no browser, no plotting library. Every chart is a dict

    {"id", "title", "x_title", "y_title", "kind": "line"|"bar", "barmode": None|"stack"|"group",
     "traces": [{"name", "x": [...], "y": [...], "text"?: [...], "dash"?: bool}], "notes": [str]}

rendered by results/report.py (Plotly) and logged by results/wandb_summary.py (wandb.plot).
"""
from __future__ import annotations

import math
from collections import defaultdict
from pathlib import Path

from scalelab.results.chart_base import (MIB, _apart, _batch_label, _median, _norm, _suffix,  # noqa: F401
                                         _throughput_series, _unique, by_reason, chart, completed, finite_median,
                                         job_name, node_split, sweep_labels, sweep_of)
from scalelab.results.record import max_of, num_nodes
from scalelab.results.sweep import job_key, per_rank_batch, run_key
from scalelab.results.table import job_labels, no_baseline_note, vs_baseline


# ---------------------------------------------------------------------------------------------
def efficiency(summaries: list[dict], records: list[dict], kind: str, group_by: str | None = None,
               names: dict | None = None) -> dict:
    """Scaling efficiency vs world size, one series per sweep.aggregate group of KIND
    (strong: same global batch; weak: same per-rank batch), plus the ideal line (1.0). Only the
    selected runs are drawn; efficiencies stay against their sweep's baseline."""
    # A summary's runs are found where they are (their folder in its sweep): two sweeps in folders
    # of one name have the same job names. By name only where one side has no folder.
    by_dir = {k: r for r in records if (k := job_key(r))}
    by_job = {job_name(r): r for r in records}
    no_dir = {job_name(r): r for r in records if not job_key(r)}

    def rec_of(s: dict, job: str, folder: str | None) -> dict | None:
        return (by_dir.get(run_key(s, folder) or "") or no_dir.get(job)) if folder is not None else by_job.get(job)

    traces, labels, rules, bases, base_runs = [], [], [], [], []
    sweeps = sweep_labels([s.get("sweep_dir") for s in summaries], names)
    for s in summaries:
        for g in s.get("groups", []):
            if g["kind"] != kind:
                continue
            # each run's node count (a summary from before it was written: its record's)
            runs = [{**m, "num_nodes": m.get("num_nodes") or num_nodes(rec)} for m in g["runs"]
                    if (rec := rec_of(s, m["job"], m.get("dir")))]
            if not runs:
                continue
            base = (rec_of(s, g["baseline_job"], g.get("baseline_dir"))
                    or rec_of(s, runs[0]["job"], runs[0].get("dir")))
            if kind == "strong":
                name = f"{g['strategy']} b{runs[0]['global_batch_size']}"
            else:
                name = f"{g['strategy']} {per_rank_batch(base)}/rank"
            if sweeps:
                name = f"{sweeps[_norm(s.get('sweep_dir'))]}: {name}"
            # a line that starts above 1 device starts on the ideal line by definition: its name says
            # what it is measured against (and whether that was a short run)
            vs = vs_baseline(g["baseline_world_size"], g.get("baseline_short_run"))
            layout = node_split(runs, key=lambda m: 0)   # one world on two node counts: a line each
            for part in dict.fromkeys(layout[id(m)] for m in runs):
                line = [m for m in runs if layout[id(m)] == part]
                # --group-by's value where the line's runs share it (world_size differs along the
                # line: every line read [world_size=1], its baseline's)
                said = {_suffix(rec, group_by, bool(sweeps)) for m in line
                        if (rec := rec_of(s, m["job"], m.get("dir")))}
                labels.append(name + part + vs + (said.pop() if len(said) == 1 else ""))
                rules.append(f"lr_rule={base.get('lr_rule')}")
                bases.append(f"(base {g['baseline_job']})")
                base_runs.append(base)
                # repeats at one world size (runs that differ only in where their files go or how
                # they were launched): their median, as the throughput chart's; one point per world
                at: dict[int, list[float]] = defaultdict(list)
                for m in line:
                    at[m["world_size"]].append(m["scaling_efficiency"])
                traces.append({"x": sorted(at), "y": [_median(at[w]) for w in sorted(at)],
                               "strategy": str(g["strategy"])})
    # where two groups share a name: what their runs differ in first (model=gpt_mini), then the
    # LR rule, then the baseline job
    label_of = dict(zip(map(id, base_runs), labels))   # a base split into node lines: its names tell them apart
    apart = _apart(list({id(b): b for b in base_runs}.values()), key=lambda r: label_of[id(r)], pooled=("strategy.",))
    what = [apart[id(b)].strip() for b in base_runs]
    for t, n in zip(traces, _unique(labels, [what, rules, bases])):
        t["name"] = n
    notes = []
    # a short run above its group's baseline: its point is no steady figure (a resumed or requeued
    # job counts this attempt's steps only), and nothing on the line said so
    short = [rec for s in summaries for g in s.get("groups", []) if g["kind"] == kind for m in g["runs"]
             if m.get("short_run") and m["world_size"] != g["baseline_world_size"]
             and (rec := rec_of(s, m["job"], m.get("dir")))]
    if short:
        labels_of = job_labels(records)
        notes.append("short runs (fewer than 5 measured steps), their points not steady-state: "
                     + ", ".join(dict.fromkeys(job_name(r, labels_of) for r in short)))
    # runs with no line to be on: where their only partner failed, the chart said there were no such
    # runs (an all-failed sweep too), or dropped the line without a word (review)
    labels = job_labels(records)
    failed_names = [job_name(r, labels) for r in records if r.get("status") != "completed"]
    failed_said = (f"; failed, so in no group: {', '.join(failed_names[:8])}{', ...' if len(failed_names) > 8 else ''}"
                   if failed_names else "")
    if traces:
        worlds = sorted({x for t in traces for x in t["x"]})
        traces.append({"name": "ideal", "x": worlds, "y": [1.0] * len(worlds), "dash": True})
        if kind == "strong":
            notes += [n + failed_said for n in no_baseline_note(records, labels)]
    else:
        notes.append(f"no {kind}-scaling group: no completed runs that differ only in world size"
                     + (" with the same global batch" if kind == "strong" else " with the same per-rank batch")
                     + failed_said)
    what = "same global batch" if kind == "strong" else "same per-rank batch"
    return chart(f"efficiency_{kind}", f"{kind.capitalize()} scaling ({what})", "world size N",
                 "efficiency = thr(N) / (N x thr(N0) / N0)", traces, notes=notes)


def throughput(records: list[dict], group_by: str | None = None, names: dict | None = None) -> dict:
    """Tokens/s vs world size, one series per sweep (where there are several), strategy and
    global batch: the median over the repeats of one sweep, never over two sweeps, nor over two
    node layouts of one world size (node_split: a series each). Where no run has a token
    throughput (an mlp model has no tokens: the chart was empty), samples/s, and the axis says so."""
    series: dict[tuple, dict[int, list[dict]]] = defaultdict(lambda: defaultdict(list))   # its runs per world size
    done = completed(records)
    metric, unit = "tokens_per_s", "tokens/s"
    runs = [r for r in done if _finite((r.get("throughput") or {}).get(metric))]
    if not runs:
        metric, unit = "samples_per_s", "samples/s"
        runs = [r for r in done if _finite((r.get("throughput") or {}).get(metric))]
    sweeps = sweep_labels([sweep_of(r) for r in runs], names)
    base = _throughput_series(runs, sweeps)
    # the LR rule and run length change no speed: their runs are repeats here
    apart = _apart(runs, base, pooled=("lr_scaling.", "trainer.max_steps"))
    layout = node_split(runs, lambda r: (*base(r), apart[id(r)]))
    for r in runs:
        key = (*base(r), layout[id(r)] + _suffix(r, group_by, bool(sweeps)) + apart[id(r)])
        series[key][r["world_size"]].append(r)
    names = {k: f"{k[0]}: {k[1]} {_batch_label(k[2])}{k[3]}" if k[0] else f"{k[1]} {_batch_label(k[2])}{k[3]}"
             for k in series}
    traces = [{"name": names[k], "x": sorted(v), "y": [_median([float(r["throughput"][metric]) for r in v[w]])
                                                        for w in sorted(v)], "strategy": k[1]}
              for k, v in sorted(series.items())]
    notes = [] if traces else ["no completed run with a throughput"]
    shown, labels = {id(r) for r in runs}, job_labels(records)
    # a point that is several runs (repeats in a sweep; lone runs of one config given together) says so,
    # and a short run's point is no steady figure (the table marks it *): both were drawn unmarked
    notes += [f"{names[k]} at {w}: the median of {len(rs)} runs ({', '.join(job_name(r, labels) for r in rs)})"
              for k, by_world in sorted(series.items()) for w, rs in sorted(by_world.items()) if len(rs) > 1]
    short = [job_name(r, labels) for r in runs if r.get("short_run")]
    notes += ["short runs (fewer than 5 measured steps), their points not steady-state: " + ", ".join(short)] \
        if short else []
    left = [job_name(r, labels) for r in done if id(r) not in shown
            and _finite((r.get("throughput") or {}).get("samples_per_s"))]
    notes += [f"not shown, no token throughput (samples/s only): {', '.join(left)}"] if left else []
    return chart("throughput", "Throughput vs world size", "world size", unit, traces, notes=notes)


def _finite(v) -> bool:
    """Whether V is a finite number: a chart point (null or NaN is left out)."""
    return isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v)


# Where the strategy config says a model state lives in host memory (conf/strategy/zero*.yaml): ZeRO-
# Offload keeps the optimizer state and the fp32 gradient partition it steps in host memory, ZeRO-3
# parameter offload the parameter partition too. The record's breakdown counts them (strategies/
# deepspeed.py state_bytes / grad_bytes: "host and device memory together"), so stacked under a
# device peak they made bars above it (4 GiB peak, 1 + 2 + 6 GiB of states: a 9 GiB bar).
_OFFLOADS = (("offload_optimizer", ("grads", "optimizer")), ("offload_params", ("params",)))
_OFFLOAD_BY_NAME = {"zero2_offload": ("grads", "optimizer"), "zero3_offload": ("params", "grads", "optimizer")}


def offloaded(rec: dict) -> tuple[str, ...]:
    """The model-state parts (params, grads, optimizer) RECORD's strategy keeps in host memory:
    from its config's offload keys, else (a record without them) from the strategy's name."""
    strat = (rec.get("config") or {}).get("strategy") or {}
    if any(k in strat for k, _ in _OFFLOADS):
        away = {p for k, parts in _OFFLOADS if strat.get(k) not in (None, False, "none") for p in parts}
    else:
        away = set(_OFFLOAD_BY_NAME.get(str(rec.get("strategy")), ()))
    return tuple(p for p in ("params", "grads", "optimizer") if p in away)


def memory(records: list[dict]) -> dict:
    """Per-rank memory (MiB) stacked: params, grads, optimizer state, and the rest of the peak
    (activations + runtime) = peak device memory where measured (GPUs), else peak RSS, minus the
    model states. On GPUs only what is on the device is stacked: offloaded states (offloaded) are
    in the hover text and a note. The stack never exceeds the measured peak (a part cut at it is
    noted)."""
    parts = ("params", "grads", "optimizer")
    names = ("params", "grads", "optimizer state", "activations + runtime")
    x, ys, text, skipped, hosted, cut = [], [[] for _ in names], [], [], [], []
    labels = job_labels(records)   # one bar per run: two runs named alike stacked into one before
    for r in completed(records):
        mem = r.get("memory") or {}
        states = mem.get("model_state_breakdown_per_rank") or []
        device = mem.get("peak_device_bytes_per_rank") or []
        peaks, what = (device, "device") if device else (mem.get("peak_rss_bytes_per_rank") or [], "RSS")
        if not states or len(peaks) != len(states):
            skipped.append((job_name(r, labels), "no per-rank model-state breakdown in run.json"))
            continue
        if not all(_finite(p) and isinstance(st, dict) for st, p in zip(states, peaks)):
            # a rank with a null peak or breakdown is no bar (before: None / MIB crashed the page)
            skipped.append((job_name(r, labels), f"a null per-rank peak {what} or model-state breakdown in run.json"))
            continue
        # on CPU ranks host and device are one RAM: every state is in the RSS peak
        away = offloaded(r) if device else ()
        if away:
            hosted.append(job_name(r, labels))
        for i, (st, peak) in enumerate(zip(states, peaks)):
            x.append(f"{job_name(r, labels)} r{i}")
            host = sum(st.get(p) or 0 for p in away)
            text.append(f"{r.get('strategy')} x{r.get('world_size')}: peak {what} {peak / MIB:.1f} MiB"
                        + (f"; in host memory, not stacked: {host / MIB:.1f} MiB ({', '.join(away)})" if away else ""))
            vals, room = [], peak
            for p in parts:
                v = 0 if p in away else (st.get(p) or 0)
                vals.append(min(v, room))
                room -= vals[-1]
            if vals != [0 if p in away else (st.get(p) or 0) for p in parts]:
                cut.append((job_name(r, labels), f"model states above the measured peak {what}, cut at it"))
            for j, v in enumerate(vals + [room]):
                ys[j].append(v / MIB)
    traces = [{"name": n, "x": x, "y": y, "text": text} for n, y in zip(names, ys)] if x else []
    notes = by_reason(skipped, "not shown, ") + by_reason(cut)
    notes += [f"offloaded to host memory, so not in the device bar (sizes in the hover text): {', '.join(hosted)}"
              ] if hosted else []
    if not x:
        notes.append("no completed run with a memory breakdown")
    return chart("memory", "Memory per rank, stacked", "run / rank", "MiB (peak: device on GPUs, RSS on CPU)",
                 traces, kind="bar", barmode="stack", notes=notes)


def loss_curves(records: list[dict]) -> dict:
    """Training loss per optimizer step, one trace per run, named with the LR it used."""
    traces, labels = [], job_labels(records)
    for r in completed(records):
        # a null loss (a diverged step: run.json writes NaN as null) is no point
        curve = [p for p in (r.get("loss") or {}).get("curve") or []
                 if isinstance(p, (list, tuple)) and len(p) == 2 and _finite(p[1])]
        if not curve:
            continue
        lr = f"lr {r['lr']:.3g}" if isinstance(r.get("lr"), (int, float)) else "lr ?"
        if isinstance(r.get("lr_final"), (int, float)) and r["lr_final"] != r.get("lr"):
            lr += f"->{r['lr_final']:.3g}"
        traces.append({"name": f"{job_name(r, labels)} {r.get('strategy')} x{r.get('world_size')} "
                               f"b{r.get('global_batch_size')} {lr}",
                       "x": [p[0] for p in curve], "y": [p[1] for p in curve], "strategy": str(r.get("strategy"))})
    return chart("loss", "Loss curves (legend: LR peak -> final)", "optimizer step", "training loss", traces,
                 notes=[] if traces else ["no completed run with a loss curve"])


# Strategies that step on the exact gradient of the whole global batch, so at one global batch they
# all train the same model and their final losses pool. The registry (strategies/registry.py) has no
# flag for it, so the list is here. Not in it: `single` at N > 1 ranks (N independent replicas, each
# on 1/N of the batch: strategies/single.py), local_sgd (no gradient all-reduce; replicas averaged
# every few steps), ddp_compress / ddp_powersgd (a lossy gradient all-reduce). A strategy not listed
# (a new one, until it is added here) is a series of its own rather than pooled on trust.
EXACT_GRADIENT = frozenset({"ddp", "fsdp", "fsdp_grad_op", "fsdp_tp", "tp", "nd", "pipeline", "zero1", "zero2",
                            "zero3", "zero2_offload", "zero3_offload"})


def exact_gradient(rec: dict) -> bool:
    """Whether the run stepped on the exact global-batch gradient (EXACT_GRADIENT; one rank of
    `single` does): a listed strategy whose config sets no lossy comm hook nor local SGD
    (`strategy=ddp strategy.comm_hook=powersgd` is ddp_powersgd by another name)."""
    strat = (rec.get("config") or {}).get("strategy") or {}
    if strat.get("comm_hook") not in (None, "none") or strat.get("local_sgd_period") is not None:
        return False
    return rec.get("strategy") in EXACT_GRADIENT or (rec.get("strategy") == "single" and rec.get("world_size") == 1)


def lr_scaling(records: list[dict], names: dict | None = None) -> dict:
    """Final loss vs global batch size, one series per sweep (where there are several) and LR rule
    (median over the runs of each batch size); the text is the LR each rule used at that batch.
    Runs of exact-gradient strategies pool (exact_gradient); any other run is a series of its
    strategy and world size. A NaN or infinite loss (diverged) is left out of the median and
    counted in the text."""
    series: dict[tuple, dict[int, list[dict]]] = defaultdict(lambda: defaultdict(list))
    # a null final loss with a loss curve is a diverged run (NaN, written as null): counted as one
    runs = [r for r in completed(records) if (r.get("loss") or {}).get("final") is not None
            or (r.get("loss") or {}).get("curve")]
    sweeps = sweep_labels([sweep_of(r) for r in runs], names)
    base = lambda r: (sweeps.get(_norm(sweep_of(r)), ""), str(r.get("lr_rule")))  # noqa: E731
    # strategies and world sizes pooled where each computes the same loss at one global batch
    apart = _apart(runs, base, pooled=("strategy.", "lr_scaling.rule", "lr_scaling.decay", "data.micro_batch_size",
                                       "logger."))
    for r in runs:
        own = "" if exact_gradient(r) else f" {r.get('strategy')} x{r.get('world_size')}"
        series[(*base(r), own + apart[id(r)])][r.get("global_batch_size") or 0].append(r)
    traces = []
    for (sweep, rule, sx), by_batch in sorted(series.items()):
        xs = sorted(by_batch)
        finals = {b: [m["loss"]["final"] for m in by_batch[b]] for b in xs}
        bad = {b: len(v) - len([f for f in v if finite_median([f]) is not None]) for b, v in finals.items()}
        traces.append({"name": (f"{sweep}: lr_rule={rule}" if sweep else f"lr_rule={rule}") + sx, "x": xs,
                       "y": [finite_median(finals[b]) for b in xs],
                       "text": [", ".join(f"lr {v:.3g}" for v in sorted({m.get("lr") for m in by_batch[b]
                                                                        if m.get("lr") is not None}))
                                + (f"; {bad[b]} of {len(finals[b])} diverged (NaN/inf loss, not in the median)"
                                   if bad[b] else "")
                                for b in xs]})
    return chart("lr_scaling", "Batch size x LR rule", "global batch size", "final loss (median over runs)",
                 traces, notes=[] if traces else ["no completed run with a final loss"])


def breakdown(records: list[dict]) -> dict:
    """Per rank of each profiled run: compute, transfer and wait (ms per step), stacked."""
    keys = (("compute", "compute_s"), ("transfer", "transfer_s"), ("wait", "wait_s"))
    x, ys, labels = [], [[] for _ in keys], job_labels(records)
    for r in completed(records):
        for i, pr in enumerate((r.get("breakdown") or {}).get("per_rank") or []):
            x.append(f"{job_name(r, labels)} r{i}")
            for j, (_, k) in enumerate(keys):
                ys[j].append(((pr or {}).get(k) or 0.0) * 1e3)
    traces = [{"name": n, "x": x, "y": y} for (n, _), y in zip(keys, ys)] if x else []
    return chart("breakdown", "Per rank: compute / transfer / wait", "run / rank",
                 "ms per step", traces, kind="bar", barmode="stack",
                 notes=[] if x else ["no profiled run (trainer.profile_steps) with a per-rank breakdown"])


def predictions(records: list[dict], cache: str | Path | None = None) -> tuple[list[dict], list[tuple]]:
    """The planner's step time and memory for each completed run, from the run's own hardware
    profile (mfu.hardware_profile): (rows of job, measured/predicted step_s and memory bytes,
    [(job, why)] of the runs the planner cannot model)."""
    from scalelab.plan.run_records import predicted_rss, smooth_host_speeds, speed_factor, terms_from_run
    from scalelab.plan.hardware import HOST_CPU, host_cpu_profile_path, load_hardware
    from scalelab.plan.spec import PlanError
    from scalelab.plan.peak_memory import device_total_bytes
    from scalelab.plan.step_time import step_time

    modelled, skipped, profiles = [], [], {}
    labels = job_labels(records)   # planner bars: one per run, named as the table names it
    for r in completed(records):
        name = (r.get("mfu") or {}).get("hardware_profile")
        step = (r.get("step_time_s") or {}).get("median")
        if not name or not step:
            skipped.append((job_name(r, labels), "no hardware profile (mfu) or no step time in run.json"))
            continue
        if r.get("short_run"):   # as plan --validate refuses it (it was drawn as measured, unmarked)
            skipped.append((job_name(r, labels), "short run (fewer than 5 measured steps): not a steady-state "
                                                 "step time"))
            continue
        run_cache = cache or (r.get("config") or {}).get("cache_dir")
        if name == HOST_CPU and not host_cpu_profile_path(run_cache).is_file():
            skipped.append((job_name(r, labels), "this host's CPU profile is not probed yet (a run here probes it)"))
            continue
        try:
            if (name, run_cache) not in profiles:
                profiles[(name, run_cache)] = load_hardware(name, run_cache)
            # a copy (smoothed below), named now: LABELS is keyed by id() of the original, and the
            # copy's own name was the short one two sweeps share (their runs became one bar of sums)
            modelled.append((job_name(r, labels), dict(r), terms_from_run(r), profiles[(name, run_cache)]))
        except PlanError as exc:
            skipped.append((job_name(r, labels), str(exc).splitlines()[0]))
    # the host speed plan --validate predicts at: the median probe of the sweep's neighbouring jobs
    # (one run's own probe is noisier than its step time: the chart and --validate differed by 64%)
    smooth_host_speeds([(None, run, terms) for _, run, terms, _ in modelled])
    rows = []
    for job, r, terms, hw in modelled:
        try:
            pred_step = step_time(terms, hw)["step_s"] / speed_factor(r, terms, hw)
        except PlanError as exc:
            skipped.append((job, str(exc).splitlines()[0]))
            continue
        mem = r.get("memory") or {}
        device = mem.get("peak_device_bytes_per_rank") or []
        if device:  # GPU: device memory against the planner's per-device total (null ranks: no point)
            meas_mem, pred_mem = max_of(device), device_total_bytes(terms, hw)
        else:       # CPU: host and device are one RAM (plan --validate's comparison)
            meas_mem = max_of(mem.get("peak_rss_bytes_per_rank"))
            pred_mem = predicted_rss(terms, hw)
        rows.append({"job": job, "hardware": hw.name, "measured_step_s": float(r["step_time_s"]["median"]),
                     "predicted_step_s": pred_step, "measured_bytes": meas_mem, "predicted_bytes": float(pred_mem),
                     "memory_kind": "device" if device else "RSS"})
    return rows, skipped


def planner(records: list[dict], cache: str | Path | None = None) -> list[dict]:
    """Two charts: planner step time and memory, predicted vs measured, per run."""
    rows, skipped = predictions(records, cache)
    notes = by_reason(skipped, "not predicted, ")
    x = [r["job"] for r in rows]
    step = [{"name": "measured", "x": x, "y": [r["measured_step_s"] * 1e3 for r in rows]},
            {"name": "predicted", "x": x, "y": [r["predicted_step_s"] * 1e3 for r in rows]}] if rows else []
    mem_rows = [r for r in rows if r["measured_bytes"]]
    xm = [r["job"] for r in mem_rows]
    mem = [{"name": "measured", "x": xm, "y": [r["measured_bytes"] / MIB for r in mem_rows],
            "text": [f"peak {r['memory_kind']}" for r in mem_rows]},
           {"name": "predicted", "x": xm, "y": [r["predicted_bytes"] / MIB for r in mem_rows],
            "text": [r["hardware"] for r in mem_rows]}] if mem_rows else []
    note = ["step time predicted at the host speed measured around each run (the median probe of its sweep's "
            "neighbouring jobs, run.json host_speed), as plan --validate does"]
    from scalelab.plan.hardware import HOST_CPU

    if any(r["hardware"] == HOST_CPU for r in rows):   # (make run's: 36 % over on step time, 32 % under on RSS)
        note.append(f"{HOST_CPU} is this host's matmul probe with default rates, not fitted to runs: "
                    "`scalelab plan --calibrate` fits them (README, Planning beyond this machine)")
    return [chart("planner_step", "Planner vs measured: step time", "run", "ms per step (median)", step,
                  kind="bar", barmode="group", notes=(note if rows else []) + notes),
            chart("planner_memory", "Planner vs measured: peak memory per rank", "run", "MiB (device on GPUs, RSS "
                  "on CPU)", mem, kind="bar", barmode="group",
                  notes=["runs as in the step-time chart"] if rows else notes)]


def all_charts(records: list[dict], summaries: list[dict], group_by: str | None = None,
               cache: str | Path | None = None, sweep_names: dict | None = None) -> list[dict]:
    """Every chart. Per-run charts (memory, loss, breakdown, planner) name each run by its job
    name, `<sweep>/<num>`, so only the charts that pool runs are told the sweeps' SWEEP_NAMES."""
    return [efficiency(summaries, records, "strong", group_by, sweep_names),
            efficiency(summaries, records, "weak", group_by, sweep_names),
            throughput(records, group_by, sweep_names), memory(records), loss_curves(records),
            lr_scaling(records, sweep_names), breakdown(records), *planner(records, cache)]


def failed(records: list[dict]) -> list[dict]:
    labels = job_labels(records)
    return [{"job": job_name(r, labels), "strategy": r.get("strategy"), "world_size": r.get("world_size"),
             "status": r.get("status"), "error": str(r.get("error") or "")}
            for r in records if r.get("status") != "completed"]


__all__ = ["all_charts", "breakdown", "efficiency", "failed", "loss_curves", "lr_scaling", "memory",
           "planner", "predictions", "throughput"]

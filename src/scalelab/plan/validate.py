"""Predicted vs measured step time and memory for the runs of one or more sweeps (--validate).

A sweep may repeat a config (e.g. `seed=1,2,3` in plan_validation.yaml): on a shared host one run's
step time is at the noise floor (on this 2-core VM, equivalent work measured 10-40 % apart between
runs of one sweep), so a config is judged by the median of its runs' ratios, as a benchmark reports
the median of repeats. Each run's own ratio stays in the report (`runs`), with its config's key.

Two step ratios per run: `step_ratio_raw` is predicted / measured as `scalelab plan` predicts (at
the profile's reference host speed), `step_ratio` the prediction scaled by the run's host-speed
factor. The factor's probe (mean FLOP/s of n=256 matmuls) is not the profile's reference (fastest
call of n=256/512/1024), so it reads < 1 even on an idle host: a profile calibrated at that
reference plans ~1/speed too fast, which only the raw ratio shows (--tolerance judges the scaled
ratio, --as-planned the raw one; both are printed).
"""
from __future__ import annotations

import statistics

from .run_records import (SPEED_WINDOW, check_accelerators, gpu_run, measured, predicted_rss, speed_factor,
                          usable_runs)
from .hardware import Hardware
from .peak_memory import device_total_bytes
from .step_time import step_time


def config_label(run: dict, terms) -> str:
    """How a config is shown: strategy, model, degrees, batch split, precision, threads."""
    model = run.get("model") or {}
    lay = terms.layout
    return (f"{terms.strategy.name} {model.get('name') or model.get('n_params')} N={lay.world}"
            f" (tp{lay.tp} pp{lay.pp}) nodes={lay.nodes} batch={lay.global_batch}"
            f" micro={lay.micro_batch}x{lay.micro_batches} {terms.precision}"
            f" threads={terms.threads}")


def config_key(terms) -> tuple:
    """What makes two runs the same experiment for the planner: everything it reads (model shape,
    strategy and its options, degrees and batch split, precision, optimizer, recomputation,
    threads), i.e. everything but the seed and where the run was written."""
    return (repr(terms.model), repr(terms.strategy), repr(terms.layout), terms.precision,
            terms.optimizer, terms.checkpointing, terms.threads)


def _median(xs):
    xs = [x for x in xs if x is not None]
    return statistics.median(xs) if xs else None


def validate(sweep_dir, hw: Hardware, speed_window: int = SPEED_WINDOW) -> dict:
    """Predicted vs measured step time and model-state memory for every completed run, and for
    every config (median over its repeats)."""
    runs, skipped = usable_runs(sweep_dir, speed_window)
    check_accelerators(runs, hw, "--validate")
    rows = []
    for path, run, terms in runs:
        meas = measured(run)
        speed = speed_factor(run, terms, hw)
        raw = step_time(terms, hw)["step_s"]                           # what `scalelab plan` says
        t = {k: v / speed for k, v in step_time(terms, hw).items()}   # at the run's host speed
        st = terms.states
        pred_states = st.total_bytes + st.offloaded_bytes   # on CPU, host and device are one RAM
        pred_rss = predicted_rss(terms, hw)
        gpu = gpu_run(run)
        pred_dev = device_total_bytes(terms, hw) if gpu else None
        meas_dev = max((run.get("memory") or {}).get("peak_device_bytes_per_rank") or [0]) or None
        rows.append({
            "run": str(path.parent), "config": config_label(run, terms), "strategy": terms.strategy.name,
            "world_size": terms.layout.world, "precision": terms.precision,
            "model": (run.get("model") or {}).get("name"), "seed": run.get("seed"),
            "predicted_step_s": t["step_s"], "measured_step_s": meas["step_s"],
            "step_ratio": t["step_s"] / meas["step_s"], "host_speed_factor": speed,
            "predicted_step_s_raw": raw, "step_ratio_raw": raw / meas["step_s"],
            "predicted_model_states_bytes": pred_states,
            "measured_model_states_bytes": meas["model_states_bytes"],
            "model_states_ratio": (pred_states / meas["model_states_bytes"]
                                   if meas["model_states_bytes"] else None),
            "predicted_total_bytes": pred_rss, "measured_peak_rss_bytes": meas["peak_rss_bytes"],
            "rss_ratio": pred_rss / meas["peak_rss_bytes"] if meas["peak_rss_bytes"] and not gpu else None,
            "predicted_device_bytes": pred_dev, "measured_peak_device_bytes": meas_dev,
            "device_ratio": pred_dev / meas_dev if pred_dev and meas_dev else None,
            "breakdown": t,
        })
    groups: dict[tuple, list[dict]] = {}
    for r, (_, _, terms) in zip(rows, runs):
        groups.setdefault(config_key(terms), []).append(r)
    configs = []
    for rs in groups.values():
        ratios = [r["step_ratio"] for r in rs]
        raws = [r["step_ratio_raw"] for r in rs]
        configs.append({
            "config": rs[0]["config"], "strategy": rs[0]["strategy"], "model": rs[0]["model"],
            "world_size": rs[0]["world_size"], "precision": rs[0]["precision"], "repeats": len(rs),
            "step_ratio": _median(ratios), "step_ratio_min": min(ratios), "step_ratio_max": max(ratios),
            "step_ratio_raw": _median(raws), "step_ratio_raw_min": min(raws), "step_ratio_raw_max": max(raws),
            "predicted_step_s": _median([r["predicted_step_s"] for r in rs]),
            "measured_step_s": _median([r["measured_step_s"] for r in rs]),
            "host_speed_factor": _median([r["host_speed_factor"] for r in rs]),
            "model_states_ratio": _median([r["model_states_ratio"] for r in rs]),
            "rss_ratio": _median([r["rss_ratio"] for r in rs]),
            "device_ratio": _median([r["device_ratio"] for r in rs]),
            "predicted_model_states_bytes": rs[0]["predicted_model_states_bytes"],
            "measured_model_states_bytes": _median([r["measured_model_states_bytes"] for r in rs]),
        })
    by: dict[str, dict] = {}
    for c in configs:
        b = by.setdefault(c["strategy"], {"configs": 0, "runs": 0, "min_ratio": float("inf"),
                                          "max_ratio": 0.0, "max_single_run_error": 0.0,
                                          "max_step_error_raw": 0.0})
        b["configs"] += 1
        b["runs"] += c["repeats"]
        b["min_ratio"] = min(b["min_ratio"], c["step_ratio"])
        b["max_ratio"] = max(b["max_ratio"], c["step_ratio"])
        b["max_single_run_error"] = max(b["max_single_run_error"], abs(c["step_ratio_min"] - 1),
                                        abs(c["step_ratio_max"] - 1))
        b["max_step_error_raw"] = max(b["max_step_error_raw"], abs(c["step_ratio_raw"] - 1))
    for b in by.values():
        b["max_step_error"] = max(abs(b["min_ratio"] - 1), abs(b["max_ratio"] - 1))
    step_err = [abs(c["step_ratio"] - 1) for c in configs]
    run_err = [abs(r["step_ratio"] - 1) for r in rows]
    raw_err = [abs(c["step_ratio_raw"] - 1) for c in configs]
    raw_run_err = [abs(r["step_ratio_raw"] - 1) for r in rows]
    mem_err = [abs(r["model_states_ratio"] - 1) for r in rows if r["model_states_ratio"]]
    dev_err = [abs(r["device_ratio"] - 1) for r in rows if r["device_ratio"]]
    rss_err = [abs(r["rss_ratio"] - 1) for r in rows if r["rss_ratio"]]
    return {"hardware": hw.name, "runs": rows, "configs": configs, "by_strategy": by,
            "skipped": [{"run": str(p), "reason": r} for p, r in skipped],
            "max_step_error": max(step_err) if step_err else None,
            "max_single_run_step_error": max(run_err) if run_err else None,
            "max_step_error_raw": max(raw_err) if raw_err else None,
            "max_single_run_step_error_raw": max(raw_run_err) if raw_run_err else None,
            "max_model_states_error": max(mem_err) if mem_err else None,
            "max_device_error": max(dev_err) if dev_err else None,
            "max_rss_error": max(rss_err) if rss_err else None}   # reported, not judged (noisy)

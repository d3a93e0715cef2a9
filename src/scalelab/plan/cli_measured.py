"""`scalelab plan --probe | --calibrate | --validate`: the performance model against this host and
its runs: measure this CPU again, fit a hardware profile to sweeps, and check the predictions
against sweeps' measured step time and memory (exit 1 beyond --tolerance)."""
from __future__ import annotations

import argparse
import json
import math
import sys
from pathlib import Path

import yaml

from .report import _opt, _opt_str, _print_table, _short, fmt_bytes


def tolerance(text: str) -> float:
    """--tolerance: nan passed every check (exit 0 whatever the error), -1 failed every sweep (exit 1)."""
    try:
        value = float(text)
    except ValueError:
        value = math.nan
    if not (math.isfinite(value) and value > 0):
        raise argparse.ArgumentTypeError(f"{text!r} is not valid: give a finite number > 0 (e.g. 0.15)")
    return value


def refuse_unused(a) -> None:
    """A flag its mode does not read was dropped without a word (--out of a plan, --tolerance
    without --validate, --probe beside --calibrate): one PlanError line naming it."""
    from .spec import PlanError
    modes = [f for f, on in (("--probe", a.probe), ("--calibrate", a.calibrate), ("--validate", a.validate)) if on]
    if len(modes) > 1:
        raise PlanError(f"{' and '.join(modes)}: give one of --probe, --calibrate, --validate")
    if a.out is not None and not (a.probe or a.calibrate):
        raise PlanError(f"--out {a.out}: only --probe and --calibrate write a file (a plan prints; --json for JSON)")
    if a.tolerance is not None and not a.validate:
        raise PlanError(f"--tolerance {a.tolerance}: it is the pass mark of --validate; give --validate SWEEP_DIR")


def measured(a) -> int:
    if a.probe:
        return _probe(a)
    return _calibrate(a) if a.calibrate else _validate(a)


def _out(a) -> None:
    """A given --out is checked before the probe or the fit (one PlanError line): never a run's or
    a sweep's record, nor inside their folders (`--calibrate SWEEP --out SWEEP/sweep.json` wrote a
    hardware profile over the sweep's summary), and a path that can be written."""
    from scalelab.paths import out_problem
    from .spec import PlanError
    problem = a.out and out_problem(a.out, "--out", a.calibrate or [])
    if problem:
        raise PlanError(problem)


def _probe(a) -> int:
    from .hardware import host_cpu_profile_path, probe_cpu
    _out(a)
    out = Path(a.out) if a.out else host_cpu_profile_path()
    hw = probe_cpu(out)
    print(f"wrote {out}")
    print(yaml.safe_dump(hw.to_dict(), sort_keys=False, width=100))
    return 0


def _calibrate(a) -> int:
    from .calibrate import calibrate, default_calibrated_path
    from .hardware import load_hardware
    _out(a)
    base = load_hardware(a.hardware or "this_cpu")
    out = Path(a.out) if a.out else default_calibrated_path(base.name)
    hw, rep = calibrate(a.calibrate, base, out)
    if a.json:
        print(json.dumps(rep, indent=2))
        return 0
    print(f"fitted {len(rep['runs'])} runs ({len(rep['skipped'])} skipped) -> {out}")
    print(f"use it with: scalelab plan --validate SWEEP_DIR --hardware {out}\n")
    print(yaml.safe_dump(hw.to_dict(), sort_keys=False, width=100))
    _print_table(["run", "strategy", "N", "measured s", "fit s", "ratio", "leave-one-out ratio", "bound by"],
                 [[_short(r["run"]), r["strategy"], r["world_size"], f"{r['measured_step_s']:.4f}",
                   f"{r['predicted_step_s']:.4f}", f"{r['ratio']:.3f}", _opt(r["loo_ratio"]),
                   "host (floor)" if r["host_bound"] else "device"] for r in rep["runs"]])
    for s in rep["skipped"]:
        print(f"skipped {s['run']}: {s['reason']}")
    return 0


def _validate(a) -> int:
    from .validate import validate
    from .hardware import load_hardware
    hw = load_hardware(a.hardware or "this_cpu")
    rep = validate(a.validate, hw)
    if a.json:
        print(json.dumps(rep, indent=2))
    else:
        print(f"predicted ({hw.name}) vs measured, {len(rep['runs'])} runs")
        _print_table(
            ["run", "strategy", "model", "N", "seed", "prec", "host speed", "step pred s", "step meas s",
             "ratio", "states pred", "states meas", "ratio", "RSS pred/meas", "device pred/meas"],
            [[_short(r["run"]), r["strategy"], r["model"] or "-", r["world_size"], _opt_str(r["seed"]),
              r["precision"],
              f"{r['host_speed_factor']:.2f}", f"{r['predicted_step_s']:.4f}", f"{r['measured_step_s']:.4f}", f"{r['step_ratio']:.3f}",
              fmt_bytes(r["predicted_model_states_bytes"]), fmt_bytes(r["measured_model_states_bytes"]),
              _opt(r["model_states_ratio"]), _opt(r["rss_ratio"]), _opt(r["device_ratio"])] for r in rep["runs"]])
        for s in rep["skipped"]:
            print(f"skipped {s['run']}: {s['reason']}")
        repeated = any(c["repeats"] > 1 for c in rep["configs"])
        if repeated:
            # A config run several times (seeds) is judged by the median of its runs' ratios.
            print(f"\nper config: median over its repeats ({len(rep['configs'])} configs)")
            _print_table(
                ["config", "runs", "step ratio median", "min", "max", "states ratio"],
                [[c["config"], c["repeats"], f"{c['step_ratio']:.3f}", f"{c['step_ratio_min']:.3f}",
                  f"{c['step_ratio_max']:.3f}", _opt(c["model_states_ratio"])]
                 for c in sorted(rep["configs"], key=lambda c: c["config"])])
        print()
        what = "config medians" if repeated else "runs"
        _print_table(["strategy", "configs", "runs", f"step ratio min ({what})", "max",
                      "max |ratio - 1|", "worst single run"],
                     [[k, b["configs"], b["runs"], f"{b['min_ratio']:.3f}", f"{b['max_ratio']:.3f}",
                       f"{b['max_step_error']:.3f}", f"{b['max_single_run_error']:.3f}"]
                      for k, b in sorted(rep["by_strategy"].items())])
        if rep["max_step_error"] is not None:
            print(f"max |step ratio - 1| = {rep['max_step_error']:.3f} ({what})"
                  + (f"; worst single run {rep['max_single_run_step_error']:.3f}" if repeated else "")
                  + (f"; max |model-state ratio - 1| = {rep['max_model_states_error']:.3f}"
                     if rep["max_model_states_error"] is not None else ""))
    if a.tolerance is not None and (rep["max_step_error"] or 0) > a.tolerance:
        print(f"error: step-time prediction off by {rep['max_step_error']:.1%} (config median) > "
              f"tolerance {a.tolerance:.1%}", file=sys.stderr)
        return 1
    return 0

"""`scalelab plan --probe | --calibrate | --validate`: the performance model against this host and
its runs: measure this CPU again, fit a hardware profile to sweeps, and check the predictions
against sweeps' measured step time and memory. Exit 1 beyond --tolerance on: the step time as
`scalelab plan` predicts it (the profile's reference host speed; config medians), model-state
bytes and device memory (each run, where recorded). Peak RSS is reported, not judged (noisy)."""
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


# for cli.py's --tolerance help: what --validate judges with it
TOLERANCE_HELP = ("with --validate: exit 1 if a config's step-time ratio (at each run's host speed, or as planned "
                  "with --as-planned; median over its repeats), a run's model-state bytes or its device memory is "
                  "off by more than this (a finite number > 0, e.g. 0.15); peak RSS is reported, not judged")


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
    if getattr(a, "as_planned", False) and not a.validate:
        raise PlanError("--as-planned: it is how --validate judges step time; give --validate SWEEP_DIR")
    if modes:
        # `--validate SWEEP --strategy zero3 --devices 8 --params 7B` exited 0, the four dropped
        given = [f for f in _PLAN_FLAGS + (("hardware", "json") if a.probe else ())
                 if getattr(a, f, None) is not None and getattr(a, f) is not False]   # --devices 0 is given
        if given or getattr(a, "overrides", None):
            what = "--" + given[0].replace("_", "-") if given else a.overrides[0]
            if a.probe:
                raise PlanError(f"{what} with --probe: the probe measures this CPU and takes only --out")
            takes = "--out" if a.calibrate else "--tolerance, --as-planned"
            raise PlanError(f"{what} with {modes[0]}: it plans each run's own job from its record (it takes "
                            f"--hardware, --json, {takes}); to plan a job, leave {modes[0]} out")


# the flags of a plan (cli.add_arguments): a job to plan, which --probe/--calibrate/--validate do not read
_PLAN_FLAGS = ("params", "layers", "hidden", "heads", "vocab", "seq_len", "ffn_hidden", "model", "attention",
               "dropout", "strategy", "devices", "nodes", "tp", "pp", "global_batch", "micro_batch", "precision",
               "optimizer", "activation_checkpointing", "no_sequence_parallel", "tokens")


def measured(a) -> int:
    if a.probe:
        return _probe(a)
    return _calibrate(a) if a.calibrate else _validate(a)


def _out(a, out: Path) -> None:
    """--out (given, or the default OUT) is checked before the probe or the fit (one PlanError
    line): never a run's or a sweep's record, nor inside their folders (`--calibrate SWEEP --out
    SWEEP/sweep.json` wrote a hardware profile over the sweep's summary), a path that can be
    written, and never over a profile --probe or --calibrate did not write (`--out
    conf/hardware/h100_sxm.yaml` replaced the committed H100 with this CPU's fit, without a word)."""
    from scalelab.paths import out_problem
    from .spec import PlanError
    problem = a.out and out_problem(a.out, "--out", a.calibrate or [])
    if problem:
        raise PlanError(problem)
    if out.is_file():
        from .hardware import CALIBRATED_HEADER, PROBE_HEADER

        with open(out, errors="replace") as f:
            first = f.readline()
        if not first.startswith((CALIBRATED_HEADER, PROBE_HEADER)):   # a profile someone wrote
            how = "--out" if a.out else "the default --out"
            raise PlanError(f"{how} {out} is a hardware profile that `scalelab plan --probe/--calibrate` did not "
                            "write: it would be replaced; give --out a new path (or delete it first)")


def _probe(a) -> int:
    from .hardware import host_cpu_profile_path, probe_cpu
    out = Path(a.out) if a.out else host_cpu_profile_path()
    _out(a, out)
    hw = probe_cpu(out)
    print(f"wrote {out}")
    print(yaml.safe_dump(hw.to_dict(), sort_keys=False, width=100))
    return 0


def _calibrate(a) -> int:
    from .calibrate import calibrate, default_calibrated_path
    from .hardware import load_hardware
    base = load_hardware(a.hardware or "this_cpu")
    out = Path(a.out) if a.out else default_calibrated_path(base.name)
    _out(a, out)
    hw, rep = calibrate(a.calibrate, base, out)
    cal = hw.calibration
    if cal["underdetermined"]:
        print(f"warning: {cal['fitted_runs']} runs for {len(cal['fitted_terms'])} fitted terms"
              + ("" if cal["leave_one_out_max_relative_error"] is not None else ", no leave-one-out")
              + f": these runs cannot pin its rates down (the in-sample ratios below say how well it fits them, not "
              f"what it predicts; underdetermined: true in {out});"
              " calibrate on more runs (batch sizes, models) before planning with it", file=sys.stderr)
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
        _print_validation(rep, hw)
    return _judge(a, rep)


def _judge(a, rep: dict) -> int:
    """--tolerance: exit 1 when the step time, model-state bytes or device memory is off by more;
    one error line each. The step time is judged at each run's host speed (a shared host drifts:
    that is no error of the model), or as `scalelab plan` prints it with --as-planned (the
    profile's reference speed reads above a run's probe even on an idle host: both are printed)."""
    if a.tolerance is None:
        return 0
    tol, corrected = a.tolerance, not getattr(a, "as_planned", False)
    step = rep["max_step_error"] if corrected else rep["max_step_error_raw"]
    checks = [(step, "step-time prediction " + ("at each run's host speed" if corrected else
                                                 "as planned (profile's reference host speed)") + " (config median)"),
              (rep["max_model_states_error"], "model-state bytes (worst run)"),
              (rep["max_device_error"], "device memory (worst run)")]
    failed = [(err, what) for err, what in checks if err is not None and err > tol]
    for err, what in failed:
        print(f"error: {what} off by {err:.1%} > tolerance {tol:.1%}", file=sys.stderr)
    return 1 if failed else 0


def _print_validation(rep: dict, hw) -> None:
    print(f"predicted ({hw.name}) vs measured, {len(rep['runs'])} run{'s' if len(rep['runs']) != 1 else ''}; step ratio = predicted / measured "
          "as planned (at the profile's reference host speed), and at the run's host speed")
    _print_table(
        ["run", "strategy", "model", "N", "seed", "prec", "host speed", "step pred s (as planned)", "step meas s",
         "ratio as planned", "ratio at host speed", "states pred", "states meas", "ratio", "RSS pred/meas",
         "device pred/meas"],
        [[_short(r["run"]), r["strategy"], r["model"] or "-", r["world_size"], _opt_str(r["seed"]),
          r["precision"], f"{r['host_speed_factor']:.2f}", f"{r['predicted_step_s_raw']:.4f}",
          f"{r['measured_step_s']:.4f}", f"{r['step_ratio_raw']:.3f}", f"{r['step_ratio']:.3f}",
          fmt_bytes(r["predicted_model_states_bytes"]), fmt_bytes(r["measured_model_states_bytes"]),
          _opt(r["model_states_ratio"]), _opt(r["rss_ratio"]), _opt(r["device_ratio"])] for r in rep["runs"]])
    for s in rep["skipped"]:
        print(f"skipped {s['run']}: {s['reason']}")
    repeated = any(c["repeats"] > 1 for c in rep["configs"])
    if repeated:
        # A config run several times (seeds) is judged by the median of its runs' ratios.
        print(f"\nper config: median over its repeats ({len(rep['configs'])} configs)")
        _print_table(
            ["config", "runs", "ratio as planned", "step ratio median (host speed)", "min", "max", "states ratio"],
            [[c["config"], c["repeats"], f"{c['step_ratio_raw']:.3f}", f"{c['step_ratio']:.3f}",
              f"{c['step_ratio_min']:.3f}", f"{c['step_ratio_max']:.3f}", _opt(c["model_states_ratio"])]
             for c in sorted(rep["configs"], key=lambda c: c["config"])])
    print()
    what = "config medians" if repeated else "runs"
    _print_table(["strategy", "configs", "runs", "max |ratio as planned - 1|", f"step ratio min ({what}, host speed)",
                  "max", "max |ratio - 1| (host speed)", "worst single run"],
                 [[k, b["configs"], b["runs"], f"{b['max_step_error_raw']:.3f}", f"{b['min_ratio']:.3f}",
                   f"{b['max_ratio']:.3f}", f"{b['max_step_error']:.3f}", f"{b['max_single_run_error']:.3f}"]
                  for k, b in sorted(rep["by_strategy"].items())])
    print(f"max |step ratio - 1| ({what}): as planned {rep['max_step_error_raw']:.3f}, at host speed "
          f"{rep['max_step_error']:.3f}" + (f" (worst single run {rep['max_single_run_step_error']:.3f})" if repeated else ""))
    mem = [(rep["max_model_states_error"], "model-state", ""), (rep["max_device_error"], "device memory", ""),
           (rep["max_rss_error"], "peak RSS", " (reported, not judged by --tolerance: noisy)")]
    line = "; ".join(f"max |{what} ratio - 1| = {err:.3f}{note}" for err, what, note in mem if err is not None)
    if line:
        print(line)

"""`scalelab plan`: argparse wiring (add_arguments / run) and the table renderer.

    scalelab plan (--params N | --layers L --hidden H --heads A [--vocab V] [--seq-len S] | --model NAME)
                  --strategy S --devices N [--nodes N] [--tp T] [--pp P] [--micro-batch B]
                  [--global-batch G] [--precision P] [--optimizer adam|sgd]
                  [--activation-checkpointing none|selective|full] [--attention flash|math]
                  [--dropout P] [--hardware H] [--tokens T] [--json]
    scalelab plan --probe [--out PATH]                       measure this CPU -> conf/hardware/this_cpu.yaml
    scalelab plan --calibrate SWEEP_DIR [SWEEP_DIR ...] [--hardware H] [--out PATH]
    scalelab plan --validate SWEEP_DIR [SWEEP_DIR ...] [--hardware H] [--tolerance 0.15] [--json]
"""
from __future__ import annotations

import argparse
import json
import sys
from dataclasses import replace
from pathlib import Path

import yaml

from .spec import ATTENTION, CHECKPOINTING, STRATEGIES, ModelSpec, PlanError, conf_dir, get_strategy, strategy_names

DEFAULT_HARDWARE = "h100_sxm"
DEFAULT_VOCAB, DEFAULT_SEQ = 50257, 2048


def _count(text: str) -> float:
    """7e9, 7B, 1.3b, 350M, 2T -> float."""
    t = str(text).strip().lower().replace("_", "").replace(",", "")
    mult = {"k": 1e3, "m": 1e6, "b": 1e9, "g": 1e9, "t": 1e12}.get(t[-1:], None)
    try:
        return float(t[:-1]) * mult if mult else float(t)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a number: {text!r} (e.g. 7e9, 7B, 350M)") from None


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """Add every `scalelab plan` flag to `parser` (a subparser)."""
    m = parser.add_argument_group("model (--params, or the shape, or --model)")
    m.add_argument("--params", type=_count, help="parameter count (7e9, 7B); shape guessed if not given")
    m.add_argument("--layers", type=int)
    m.add_argument("--hidden", type=int)
    m.add_argument("--heads", type=int)
    m.add_argument("--vocab", type=int, help=f"vocabulary size (default {DEFAULT_VOCAB})")
    m.add_argument("--seq-len", type=int, help=f"sequence length (default {DEFAULT_SEQ})")
    m.add_argument("--ffn-hidden", type=int, help="MLP width (default 4 x hidden)")
    m.add_argument("--model", help="a model config in conf/model/ (e.g. gpt_small)")
    # Strings, checked by ModelSpec: a bad value is one PlanError line, not an argparse usage dump.
    m.add_argument("--attention", default="flash",
                   help=f"{' | '.join(ATTENTION)}: flash/memory-efficient kernels keep O(s) per head "
                        "(scalelab's SDPA), math stores the s x s scores (default flash)")
    m.add_argument("--dropout", help="dropout probability (default: --model's arch.dropout, else 0)")
    j = parser.add_argument_group("job")
    j.add_argument("--strategy", help=f"one of: {', '.join(STRATEGIES)} (or any conf/strategy/ config)")
    j.add_argument("--devices", type=int, default=1, help="devices per node (default 1)")
    j.add_argument("--nodes", type=int, default=1)
    j.add_argument("--tp", type=int, help="tensor-parallel degree (tp, fsdp_tp)")
    j.add_argument("--pp", type=int, help="pipeline stages (pipeline)")
    j.add_argument("--micro-batch", type=int, default=1, help="sequences per device per micro-batch")
    j.add_argument("--global-batch", type=int, help="sequences per optimizer step (default dp x micro)")
    j.add_argument("--precision", default="bf16-mixed", help="32, bf16-mixed or fp16-mixed")
    j.add_argument("--optimizer", default="adam", help="adam or sgd (with momentum)")
    j.add_argument("--activation-checkpointing", default="none", help=" | ".join(CHECKPOINTING))
    j.add_argument("--no-sequence-parallel", action="store_true",
                   help="with tp > 1, keep LayerNorm/dropout activations replicated")
    j.add_argument("--hardware", help=f"profile in conf/hardware/ or a .yaml path (default "
                                      f"{DEFAULT_HARDWARE}; this_cpu for --calibrate/--validate)")
    j.add_argument("--tokens", type=_count, help="also estimate time, cost and energy to train T tokens")
    j.add_argument("--json", action="store_true", help="print JSON instead of a table")
    c = parser.add_argument_group("probe / calibration / validation")
    c.add_argument("--probe", action="store_true", help="measure this CPU, write conf/hardware/this_cpu.yaml")
    c.add_argument("--calibrate", metavar="SWEEP_DIR", nargs="+",
                   help="fit the hardware profile to the runs measured under these sweep dirs")
    c.add_argument("--validate", metavar="SWEEP_DIR", nargs="+",
                   help="predicted vs measured for every run under these sweep dirs")
    c.add_argument("--out", help="where --probe / --calibrate write the profile")
    c.add_argument("--tolerance", type=float,
                   help="with --validate: exit 1 if any config's step-time ratio (median over its repeats) is off by more than this")


def run(args: argparse.Namespace) -> int:
    """Execute `scalelab plan`; print; 0 ok, 1 validation outside tolerance, 2 bad input."""
    try:
        if args.probe:
            return _probe(args)
        if args.calibrate:
            return _calibrate(args)
        if args.validate:
            return _validate(args)
        return _plan(args)
    except PlanError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2


# --------------------------------------------------------------------------------------------
def _model_from_args(a) -> ModelSpec:
    model = _model_shape_from_args(a)
    kw = {"attention": getattr(a, "attention", None) or "flash"}
    if getattr(a, "dropout", None) is not None:      # else: the model config's, or 0
        kw["dropout"] = a.dropout
    return replace(model, **kw)


def _model_shape_from_args(a) -> ModelSpec:
    shape = [a.layers, a.hidden, a.heads]
    if a.model:
        return _model_from_conf(a.model)
    if all(v is not None for v in shape):
        return ModelSpec.from_shape(a.layers, a.hidden, a.heads, a.vocab or DEFAULT_VOCAB,
                                    a.seq_len or DEFAULT_SEQ, a.ffn_hidden or 0,
                                    int(a.params) if a.params else None)
    if a.params is not None:
        if any(v is not None for v in shape):
            raise PlanError("give the whole shape (--layers --hidden --heads) or only --params")
        return ModelSpec.from_params(a.params, a.seq_len or DEFAULT_SEQ, a.vocab or DEFAULT_VOCAB)
    raise PlanError("no model: give --params N, or --layers L --hidden H --heads A "
                    "[--vocab V --seq-len S], or --model NAME")


def _model_from_conf(name: str) -> ModelSpec:
    path = conf_dir() / "model" / f"{name}.yaml"
    if not path.is_file():
        valid = sorted(p.stem for p in (conf_dir() / "model").glob("*.yaml"))
        raise PlanError(f"unknown model {name!r}; valid: {', '.join(valid) or '(none)'}")
    arch = (yaml.safe_load(path.read_text()) or {}).get("arch") or {}
    if "d_model" in arch:
        L, h, V, s = (int(arch[k]) for k in ("n_layers", "d_model", "vocab_size", "seq_len"))
        f = int(arch.get("mlp_ratio", 4) * h)
        # scalelab.models.gpt: bias-free linears, 2 LayerNorms per block, learned positions, untied head.
        n = L * (4 * h * h + 2 * h * f + 4 * h) + 2 * V * h + s * h + 2 * h
        return ModelSpec.from_shape(L, h, int(arch["n_heads"]), V, s, f, n_params=n,
                                    dropout=arch.get("dropout") or 0.0)
    if "hidden" in arch:                                  # MLP classifier
        widths = [int(arch["in_features"]), *map(int, arch["hidden"]), int(arch["num_classes"])]
        n = sum(i * o + o for i, o in zip(widths, widths[1:]))
        return ModelSpec(n, len(widths) - 1, max(widths), 1, int(arch["num_classes"]), 1, kind="mlp")
    raise PlanError(f"model config {str(path)!r} has no arch.d_model or arch.hidden")


def _plan(a) -> int:
    from .step_time import plan
    if not a.strategy:
        raise PlanError(f"--strategy is required; valid: {', '.join(strategy_names())}")
    get_strategy(a.strategy)
    model = _model_from_args(a)
    kw = dict(devices=a.devices, nodes=a.nodes, tp=a.tp, pp=a.pp, micro_batch=a.micro_batch,
              global_batch=a.global_batch, precision=a.precision, optimizer=a.optimizer,
              activation_checkpointing=a.activation_checkpointing, tokens=a.tokens)
    doc = plan(model, a.strategy, a.hardware or DEFAULT_HARDWARE,
               sequence_parallel=not a.no_sequence_parallel, **kw)
    print(json.dumps(doc, indent=2) if a.json else render(doc))
    return 0


def _probe(a) -> int:
    from .hardware import probe_cpu
    out = Path(a.out) if a.out else conf_dir() / "hardware" / "this_cpu.yaml"
    hw = probe_cpu(out)
    print(f"wrote {out}")
    print(yaml.safe_dump(hw.to_dict(), sort_keys=False, width=100))
    return 0


def _calibrate(a) -> int:
    from .calibrate import calibrate, default_calibrated_path
    from .hardware import load_hardware
    base = load_hardware(a.hardware or "this_cpu")
    out = Path(a.out) if a.out else default_calibrated_path(base.name)
    hw, rep = calibrate(a.calibrate, base, out)
    if a.json:
        print(json.dumps(rep, indent=2))
        return 0
    print(f"fitted {len(rep['runs'])} runs ({len(rep['skipped'])} skipped) -> {out}")
    print(f"use it with: scalelab plan --validate SWEEP_DIR --hardware {out}\n")
    print(yaml.safe_dump(hw.to_dict(), sort_keys=False, width=100))
    _print_table(["run", "strategy", "N", "measured s", "fit s", "ratio", "leave-one-out ratio"],
                 [[_short(r["run"]), r["strategy"], r["world_size"], f"{r['measured_step_s']:.4f}",
                   f"{r['predicted_step_s']:.4f}", f"{r['ratio']:.3f}", _opt(r["loo_ratio"])]
                  for r in rep["runs"]])
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
             "ratio", "states pred", "states meas", "ratio", "RSS pred/meas"],
            [[_short(r["run"]), r["strategy"], r["model"] or "-", r["world_size"], _opt_str(r["seed"]),
              r["precision"],
              f"{r['host_speed_factor']:.2f}", f"{r['predicted_step_s']:.4f}", f"{r['measured_step_s']:.4f}", f"{r['step_ratio']:.3f}",
              fmt_bytes(r["predicted_model_states_bytes"]), fmt_bytes(r["measured_model_states_bytes"]),
              _opt(r["model_states_ratio"]), _opt(r["rss_ratio"])] for r in rep["runs"]])
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


# --------------------------------------------------------------------------------------------
# Rendering
# --------------------------------------------------------------------------------------------
def fmt_bytes(n) -> str:
    if n is None:
        return "-"
    for unit, div in (("TiB", 2 ** 40), ("GiB", 2 ** 30), ("MiB", 2 ** 20), ("KiB", 2 ** 10)):
        if abs(n) >= div:
            return f"{n / div:.2f} {unit}"
    return f"{n:.0f} B"


def fmt_time(s: float) -> str:
    for unit, div in (("d", 86400), ("h", 3600), ("min", 60), ("s", 1), ("ms", 1e-3), ("us", 1e-6)):
        if s >= div:
            return f"{s / div:.3g} {unit}"
    return f"{s:.3g} s"


def _si(x: float) -> str:
    for unit, div in (("E", 1e18), ("P", 1e15), ("T", 1e12), ("G", 1e9), ("M", 1e6), ("k", 1e3)):
        if abs(x) >= div:
            return f"{x / div:.3g}{unit}"
    return f"{x:.3g}"


def _opt_str(x) -> str:
    return "-" if x is None else str(x)


def _opt(x) -> str:
    return "-" if x is None else f"{x:.3f}"


def _short(path: str) -> str:
    parts = Path(path).parts
    return "/".join(parts[-2:]) if len(parts) > 1 else path


def _print_table(header, rows) -> None:
    w = [max(len(str(x)) for x in col) for col in zip(header, *rows)] if rows else [len(h) for h in header]
    print("  ".join(str(h).ljust(n) for h, n in zip(header, w)))
    print("  ".join("-" * n for n in w))
    for r in rows:
        print("  ".join(str(x).ljust(n) for x, n in zip(r, w)))


def render(doc: dict) -> str:
    i, p, mem, t = doc["inputs"], doc["inputs"]["parallel"], doc["memory"], doc["time"]
    md = i["model"]
    out = [f"plan: {i['strategy']} on {p['world_size']} x {i['hardware']} ({p['nodes']} node(s) x "
           f"{p['devices_per_node']}), dp={p['dp']} tp={p['tp']} pp={p['pp']}"
           + (" +sequence-parallel" if p["sequence_parallel"] else ""),
           f"model: {_si(md['n_params'])} params ({md['n_layers']} layers, hidden {md['hidden']}, "
           f"{md['heads']} heads, vocab {md['vocab']}, seq {md['seq_len']}"
           + (", shape guessed from --params" if md["shape_inferred"] else "")
           + f", {md.get('attention', 'flash')} attention"
           + (f", dropout {md['dropout']:g}" if md.get("dropout") else "") + f"), "
           f"{i['precision']}, {i['optimizer']}, activation checkpointing {i['activation_checkpointing']}",
           f"batch: micro {p['micro_batch']} x dp {p['dp']} x {p['micro_batches_per_step']} micro-batches"
           f" = global {p['global_batch']} ({p['global_batch'] * md['seq_len']:,} tokens/step)", ""]
    out.append("memory per device")
    for label, key in (("parameters", "parameters_bytes_per_device"),
                       ("gradients", "gradients_bytes_per_device"),
                       ("optimizer states", "optimizer_bytes_per_device"),
                       ("= model states", "model_states_bytes_per_device"),
                       ("activations", "activations_bytes_per_device"),
                       ("buffers (gathered layers, buckets)", "buffers_bytes_per_device"),
                       ("runtime (context / process)", "runtime_bytes_per_device")):
        out.append(f"  {label:<36}{fmt_bytes(mem[key]):>12}")
    verdict = "fits" if mem["fits"] else "DOES NOT FIT"
    out.append(f"  {'total':<36}{fmt_bytes(mem['total_bytes_per_device']):>12}  of "
               f"{fmt_bytes(mem['device_memory_bytes'])} -> {verdict}")
    if mem["offloaded_bytes_per_device"]:
        out.append(f"  {'offloaded to host memory':<36}{fmt_bytes(mem['offloaded_bytes_per_device']):>12}")
    out += ["", "communication per step per device"]
    for c in doc["comm"]["collectives"]:
        out.append(f"  {c['name']:<30} {c['op']:<15} group {c['group']}={c['group_size']:<4} "
                   f"{c['calls']:>7g} calls {fmt_bytes(c['bytes_per_step_per_device']):>12}"
                   + ("  inter-node" if c["crosses_nodes"] else ""))
    if not doc["comm"]["collectives"]:
        out.append("  none")
    out.append(f"  {'total sent (device links)':<36}{fmt_bytes(doc['comm']['bytes_per_step_per_device']):>12}")
    out += ["", f"step time {fmt_time(t['step_s'])} = compute {fmt_time(t['compute_s'])} + bubble "
            f"{fmt_time(t['bubble_s'])} + exposed comm {fmt_time(t['comm_exposed_s'])} (of "
            f"{fmt_time(t['comm_total_s'])}) + optimizer {fmt_time(t['optimizer_s'])} + overhead "
            f"{fmt_time(t['overhead_s'])}",
            f"FLOPs per step {_si(doc['flops']['model_per_step'])} (model), "
            f"{_si(doc['flops']['hardware_per_step_per_device'])} executed per device",
            f"throughput {_si(doc['throughput']['tokens_per_s'])} tokens/s, "
            f"{_si(doc['throughput']['samples_per_s'])} samples/s; MFU {doc['mfu']:.1%}; "
            f"scaling efficiency vs 1 device {doc['scaling_efficiency']:.1%}"]
    if doc["train"]:
        tr = doc["train"]
        out.append(f"train {_si(tr['tokens'])} tokens: {fmt_time(tr['time_s'])}, "
                   f"{tr['device_hours']:,.0f} device-hours, cost {tr['cost']:,.0f}, "
                   f"energy {tr['energy_kwh']:,.0f} kWh")
    return "\n".join(out)

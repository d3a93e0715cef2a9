"""`scalelab plan`: argparse wiring (add_arguments / run) and the table renderer.

    scalelab plan (--params N | --layers L --hidden H --heads A [--vocab V] [--seq-len S] | --model NAME)
                  --strategy S --devices N [--nodes N] [--tp T] [--pp P] [--micro-batch B]
                  [--global-batch G] [--precision P] [--optimizer adam|sgd]
                  [--activation-checkpointing none|selective|full] [--attention flash|math]
                  [--dropout P] [--hardware H] [--tokens T] [--json]
    scalelab plan --probe [--out PATH]                       measure this CPU again -> this host's cached this_cpu
    scalelab plan --calibrate SWEEP_DIR [SWEEP_DIR ...] [--hardware H] [--out PATH]
    scalelab plan --validate SWEEP_DIR [SWEEP_DIR ...] [--hardware H] [--tolerance 0.15] [--json]
"""
from __future__ import annotations

import argparse
import json
import math
import re
import shlex
import sys
from dataclasses import replace

import yaml

from .cli_job import _micro_batch, default_global_batch, default_precision, train_command  # noqa: F401 (importers)
from .cli_measured import TOLERANCE_HELP, refuse_unused, tolerance
from .report import fmt_bytes, fmt_time, render, render_alternatives, render_rows
from .spec import (ATTENTION, CHECKPOINTING, STRATEGIES, ModelSpec, PlanError, conf_dir, get_strategy, sdpa_kernel,
                   strategy_names)

DEFAULT_HARDWARE = "h100_sxm"
DEFAULT_VOCAB, DEFAULT_SEQ = 50257, 2048


def _count(text: str) -> float:
    """7e9, 7B, 1.3b, 350M, 2T -> float."""
    t = str(text).strip().lower().replace("_", "").replace(",", "")
    mult = {"k": 1e3, "m": 1e6, "b": 1e9, "g": 1e9, "t": 1e12}.get(t[-1:], None)
    try:
        value = float(t[:-1]) * mult if mult else float(t)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a number: {text!r} (e.g. 7e9, 7B, 350M)") from None
    # a count of parameters or tokens: -5 tokens planned a negative time and cost (exit 0)
    if not (value > 0 and math.isfinite(value)):
        raise argparse.ArgumentTypeError(f"{text!r} is not a count: valid: a finite number > 0 (e.g. 7e9, 7B, 350M)")
    return value


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """Add every `scalelab plan` flag to `parser` (a subparser)."""
    parser.add_argument("overrides", nargs="*", metavar="KEY=VALUE",
                        help="scalelab-train overrides (strategy=zero3 trainer.devices=8 ...): plan exactly "
                             "that job, composed and validated as the trainer does; instead of the shape flags")
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
    m.add_argument("--attention",
                   help=f"{' | '.join(ATTENTION)}: flash/memory-efficient kernels keep O(s) per head "
                        "(scalelab's SDPA), math stores the s x s scores (default flash; math on a CPU profile "
                        "with dropout > 0, as torch runs it there)")
    m.add_argument("--dropout", help="dropout probability (default: --model's arch.dropout, else 0)")
    j = parser.add_argument_group("job")
    j.add_argument("--strategy", help=f"one of: {', '.join(STRATEGIES)} (or any conf/strategy/ config); "
                                      "a comma list or `all`: one row per strategy")
    # No argparse defaults on the job flags: given with the override form they are refused
    # (_refuse_flags_with_overrides), so a default must be told from a value given; _job_flag fills it.
    j.add_argument("--devices", type=int, help="devices per node (default 1)")
    j.add_argument("--nodes", type=int, help="nodes (default 1)")
    j.add_argument("--tp", type=int, help="tensor-parallel degree (tp, fsdp_tp)")
    j.add_argument("--pp", type=int, help="pipeline stages (pipeline)")
    j.add_argument("--global-batch", type=int,
                   help="sequences per optimizer step, over all data-parallel ranks (default: the trainer's "
                        f"data.global_batch_size{_said(default_global_batch)}, as the override form plans)")
    j.add_argument("--micro-batch", type=int,
                   help="sequences per device per forward/backward (default as the trainer derives it: the global "
                        "batch / data-parallel ranks, no accumulation; a pipeline cuts that into its micro-batches); "
                        "smaller than that: gradient accumulation")
    j.add_argument("--precision", help="32, bf16-mixed, fp16-mixed or bf16-true (default: 32 on a CPU profile such as "
                                       "this_cpu, bf16-mixed on a GPU one; as recommend and the trainer)")
    j.add_argument("--optimizer", help="adam or sgd (with momentum) (default adam)")
    j.add_argument("--activation-checkpointing", help=" | ".join(CHECKPOINTING) + " (default none)")
    j.add_argument("--no-sequence-parallel", action="store_true",
                   help="with tp > 1, keep LayerNorm/dropout activations replicated")
    j.add_argument("--hardware", help=f"profile in conf/hardware/ or a .yaml path (default "
                                      f"{DEFAULT_HARDWARE}; this_cpu for --calibrate/--validate)")
    j.add_argument("--tokens", type=_count, help="also estimate time, cost and energy to train T tokens")
    j.add_argument("--json", action="store_true", help="print JSON instead of a table")
    c = parser.add_argument_group("probe / calibration / validation")
    c.add_argument("--probe", action="store_true", help="measure this CPU again and write this host's `this_cpu` profile "
                                                          "(under $SCALELAB_CACHE/hardware/)")
    c.add_argument("--calibrate", metavar="SWEEP_DIR", nargs="+",
                   help="fit the hardware profile to the runs measured under these sweep dirs")
    c.add_argument("--validate", metavar="SWEEP_DIR", nargs="+",
                   help="predicted vs measured for every run under these sweep dirs")
    c.add_argument("--out", help="where --probe / --calibrate write the profile")
    c.add_argument("--tolerance", type=tolerance, help=TOLERANCE_HELP)
    c.add_argument("--as-planned", action="store_true",
                   help="with --validate --tolerance: judge the step time as `scalelab plan` prints it (the "
                        "profile's reference host speed), not at each run's measured host speed")


def _said(default) -> str:
    """", 16": a default read from conf/ for a help text; nothing where it cannot be read."""
    try:
        return f", {default()}"
    except PlanError:
        return ""


# The job flags the override form's own keys decide (flag attribute: the override to give instead);
# `plan strategy=ddp --devices 4 --global-batch 64` planned 1 device and batch 16, the flags dropped.
_JOB_FLAG_KEYS = {
    "devices": "trainer.devices=N", "nodes": "trainer.num_nodes=N",
    "tp": "strategy.tensor_parallel_size=T (strategy.tp=T for nd)", "pp": "strategy.dp=D (stages = world / dp)",
    "micro_batch": "data.micro_batch_size=B", "global_batch": "data.global_batch_size=G",
    "precision": "trainer.precision=P", "optimizer": "optim=adamw|sgd",
    "activation_checkpointing": "model.arch.activation_checkpointing=none|selective|full",
    "no_sequence_parallel": "strategy.sequence_parallel=false", "dropout": "model.arch.dropout=P",
    "attention": "none: scalelab-train always runs SDPA (planned as flash); drop it",
}
_JOB_DEFAULTS = {"devices": 1, "nodes": 1, "optimizer": "adam", "activation_checkpointing": "none"}
_SHAPE_FLAGS = ("params", "layers", "hidden", "heads", "vocab", "seq_len", "ffn_hidden", "model")


def _flag(attr: str) -> str:
    return "--" + attr.replace("_", "-")


def _job_flag(a, attr: str):
    """A flag-form job flag's value, or its default when not given."""
    value = getattr(a, attr, None)
    return _JOB_DEFAULTS.get(attr) if value is None else value


def _refuse_flags_with_overrides(a) -> None:
    """The override form plans exactly the job its overrides compose: a job flag beside them was
    dropped without a word, so it is one PlanError naming the override to give instead."""
    shape = [f for f in _SHAPE_FLAGS if getattr(a, f, None) is not None]
    if shape:
        raise PlanError(f"give either scalelab-train overrides or the shape flags, not both "
                        f"({_flag(shape[0])} with {a.overrides[0]}): the model is model=NAME / model.arch.*")
    for attr, key in _JOB_FLAG_KEYS.items():
        if getattr(a, attr, None) not in (None, False):
            raise PlanError(f"{_flag(attr)} with scalelab-train overrides ({a.overrides[0]}): the overrides decide "
                            f"the job; give {key}" + ("" if key.startswith("none:") else " instead"))
    given = [o for o in a.overrides if o.lstrip("+").startswith("strategy=")]
    if a.strategy and given:
        raise PlanError(f"--strategy {a.strategy} with {given[-1]}: give one of them (--strategy A,B lists "
                        "strategies for the overrides' job)")


def run(args: argparse.Namespace, job_terms=None) -> int:
    """Execute `scalelab plan`; print; 0 ok, 1 a plan (every row of a listing) that does not fit or
    a validation outside tolerance, 2 bad input."""
    try:
        refuse_unused(args)
        if args.probe or args.calibrate or args.validate:   # the model against this host's own runs
            from .cli_measured import measured

            return measured(args)
        return _plan(args, job_terms)
    except PlanError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2


# --------------------------------------------------------------------------------------------
def _model_from_args(a) -> ModelSpec:
    model = _model_shape_from_args(a)
    kw = {"attention": getattr(a, "attention", None) or "flash"}   # (CPU + dropout: math, in _plan)
    if getattr(a, "dropout", None) is not None:      # else: the model config's, or 0
        kw["dropout"] = a.dropout
    return replace(model, **kw)


def _model_shape_from_args(a) -> ModelSpec:
    shape = [a.layers, a.hidden, a.heads]
    if a.model:
        # --model is the whole shape: `--model gpt_small --params 7B` planned gpt_small's 3.3M silently
        extra = [f for f in _SHAPE_FLAGS if f != "model" and getattr(a, f, None) is not None]
        if extra:
            raise PlanError(f"--model {a.model} with {', '.join(map(_flag, extra))}: --model is the whole shape; "
                            "give --model alone, or the shape flags (--params or --layers --hidden --heads ...) alone")
        return _model_from_conf(a.model)
    for flag, v in (("--vocab", a.vocab), ("--seq-len", a.seq_len), ("--ffn-hidden", a.ffn_hidden)):
        if v is not None and v < 1:   # given as 0 or less: not the default silently (found by review)
            raise PlanError(f"{flag} must be a positive integer, got {v!r}")
    vocab = DEFAULT_VOCAB if a.vocab is None else a.vocab
    seq = DEFAULT_SEQ if a.seq_len is None else a.seq_len
    # The shape as scalelab-train builds it (untied head, no biases), so that the printed same job
    # is the planned model; --params with a whole shape overrides the count (no same job then).
    if all(v is not None for v in shape):
        if a.params:
            return ModelSpec.from_shape(a.layers, a.hidden, a.heads, vocab, seq, a.ffn_hidden or 0, int(a.params))
        return ModelSpec.trainer_gpt(a.layers, a.hidden, a.heads, vocab, seq, a.ffn_hidden or 0)
    if a.params is not None:
        if any(v is not None for v in shape):
            raise PlanError("give the whole shape (--layers --hidden --heads) or only --params")
        if a.ffn_hidden is not None:   # dropped without a word: the guessed shape's MLP is 4 x hidden
            raise PlanError(f"--ffn-hidden {a.ffn_hidden} needs the whole shape (--layers --hidden --heads): "
                            "with --params alone the shape is guessed, MLP width 4 x hidden")
        return ModelSpec.trainer_gpt_for_params(a.params, seq, vocab)
    given = [f for f, v in (("--layers", a.layers), ("--hidden", a.hidden), ("--heads", a.heads)) if v is not None]
    if given:   # "no model" hid which of the shape's flags were missing
        missing = [f for f in ("--layers", "--hidden", "--heads") if f not in given]
        raise PlanError(f"{' '.join(given)} without {', '.join(missing)}: give the whole shape (--layers L --hidden H "
                        "--heads A [--vocab V --seq-len S]), or --params N, or --model NAME")
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
        return ModelSpec.trainer_gpt(L, h, int(arch["n_heads"]), V, s, f, dropout=arch.get("dropout") or 0.0)
    if "hidden" in arch:                                  # MLP classifier
        widths = [int(arch["in_features"]), *map(int, arch["hidden"]), int(arch["num_classes"])]
        n = sum(i * o + o for i, o in zip(widths, widths[1:]))
        return ModelSpec(n, len(widths) - 1, max(widths), 1, int(arch["num_classes"]), 1, kind="mlp")
    raise PlanError(f"model config {str(path)!r} has no arch.d_model or arch.hidden")


def _strategies(value: str | None) -> list[str | None]:
    """--strategy NAME, a comma list, or all (every strategy the planner knows)."""
    if not value:
        return [None]
    # `all` inside a list too (all,ddp: "unknown strategy 'all'"), each name once (ddp,ddp: two rows)
    given = [v.strip() for v in value.split(",") if v.strip()]
    names = list(dict.fromkeys(n for v in given for n in (STRATEGIES if v == "all" else [v])))
    if not names:     # "," or " ": a traceback (IndexError) before
        raise PlanError(f"--strategy {value!r} names no strategy; valid: {', '.join(strategy_names())} "
                        "(or a comma list, or all)")
    for n in names:
        get_strategy(n)                                 # unknown -> one-line PlanError
    return names


def _plan(a, job_terms=None) -> int:
    """One plan (exit 1 with the nearest layouts that fit when it does not fit), or a row per
    strategy. `job_terms(overrides) -> (Terms, hardware name)` builds a job from scalelab-train
    overrides (scalelab.plan_job: the training config code, which plan/ does not import)."""
    from .alternatives import SAME_STRATEGY_AND_DEVICES, nearest_fitting
    from .hardware import devices_per_node_warning, load_hardware, trainer_name
    from .step_time import build_terms, for_device, plan_terms
    from .spec import normalize_precision
    from .strategies import trainer_refuses
    names = _strategies(a.strategy)
    plans = []                                          # (terms, hardware, train command)
    built = None                                        # flag form: the count of the GPT the trainer builds
    refused: list[dict] = []                            # strategies of a listing that cannot run this job
    if a.overrides:
        _refuse_flags_with_overrides(a)
        if job_terms is None:
            raise PlanError("overrides need the `scalelab plan` command (scalelab plan KEY=VALUE ...)")
        for name in names:
            overrides = a.overrides + ([f"strategy={name}"] if name else [])
            try:
                terms, hardware = job_terms(overrides)
            except PlanError as exc:
                refused.append(_refused(name, exc, len(names)))
                continue
            hw = load_hardware(a.hardware or hardware)
            # for the hardware planned on (--hardware may name another kind than the job's profile)
            terms = for_device(terms, hw.kind)
            if terms.layout.nodes > 1 and not any(o.lstrip("+").startswith("launcher=") for o in overrides):
                # the trainer refuses num_nodes > 1 under its default local launcher (config.validate)
                overrides = overrides + ["launcher=srun"]
            plans.append((terms, hw,
                          "scalelab-train " + " ".join(map(shlex.quote, overrides))))
    else:
        if names == [None]:
            raise PlanError(f"--strategy is required; valid: {', '.join(strategy_names())} (or a comma list, or all)")
        model = _model_from_args(a)
        hw = load_hardware(a.hardware or DEFAULT_HARDWARE)
        if not getattr(a, "attention", None):
            # as the run is planned (run_records.model_from_run): the flag form planned CPU dropout
            # as flash, 0.72x the override form's activations
            model = replace(model, attention=sdpa_kernel(hw.kind, model.dropout))
        # --params with a whole shape plans that count: a model the trainer does not build (no same job)
        built = model.n_params if model.kind != "gpt" else ModelSpec.trainer_gpt_params(
            model.n_layers, model.hidden, model.vocab, model.seq_len, model.ffn)
        precision = a.precision or default_precision(hw)
        # the trainer's own default batch, as the override form plans it (the flags planned dp x 1)
        global_batch = a.global_batch if a.global_batch is not None else default_global_batch()
        if global_batch < 1:   # before the micro-batch derived from it (-8 / 8 ranks: "--micro-batch ... -1")
            raise PlanError(f"--global-batch must be >= 1 (sequences per optimizer step), got {global_batch}")
        for name in names:
            kw = dict(devices=_job_flag(a, "devices"), nodes=_job_flag(a, "nodes"), tp=a.tp, pp=a.pp,
                      global_batch=global_batch, precision=precision, optimizer=_job_flag(a, "optimizer"),
                      activation_checkpointing=_job_flag(a, "activation_checkpointing"),
                      sequence_parallel=not a.no_sequence_parallel, device=hw.kind)
            try:
                # a precision the trainer refuses for this strategy is no same job (it was planned
                # and printed as one: fsdp at fp16-mixed; the override form said why it cannot run)
                refusal = trainer_refuses(get_strategy(name), normalize_precision(precision), hw.kind)
                if refusal:   # in the flags given: the trainer's keys named nothing typed here
                    typed = f"--precision {a.precision or precision}"
                    raise PlanError(re.sub(r"trainer\.precision=(16-mixed|bf16-true)", typed, refusal).replace(
                        "give trainer.precision=bf16-mixed or 32-true", "give --precision bf16-mixed or 32"))
                terms = build_terms(model, name, micro_batch=_micro_batch(a, model, name, kw), **kw)
            except PlanError as exc:
                if a.global_batch is None and "--global-batch" in str(exc):   # a value the user did not give
                    exc = PlanError(f"{exc} (without --global-batch the plan takes the trainer's default "
                                    f"data.global_batch_size, {global_batch}: give --global-batch)")
                refused.append(_refused(name, exc, len(names)))
                continue
            same = built == model.n_params and not _attention_what_if(model, hw.kind)
            plans.append((terms, hw, train_command(a, terms, trainer_name(hw)) if same else None))
    docs, warned = [], []
    for terms, hw, command in plans:
        docs.append(plan_terms(terms, hw, a.tokens))
        warning = devices_per_node_warning(terms.layout.devices_per_node, hw)
        if warning:
            docs[-1]["warning"] = warning
            if docs[-1]["warning"] not in warned:
                warned.append(docs[-1]["warning"])
        if command:
            docs[-1]["train_command"] = command
        elif built is not None and terms.model.kind == "gpt" and terms.model.ffn % terms.model.hidden:
            docs[-1]["train_command_note"] = (f"no same job: --ffn-hidden {terms.model.ffn} is not a multiple of "
                                              f"--hidden {terms.model.hidden} (scalelab-train's MLP width is "
                                              "model.arch.mlp_ratio, an integer, x d_model)")
        elif built is not None and _attention_what_if(terms.model, hw.kind):
            m = terms.model
            docs[-1]["train_command_note"] = (
                f"no same job: --attention {m.attention} is a what-if: scalelab-train's SDPA runs the "
                f"{sdpa_kernel(hw.kind, m.dropout)} kernel on a {hw.kind} profile at dropout {m.dropout:g}")
        elif built is not None and built != terms.model.n_params:
            docs[-1]["train_command_note"] = (f"no same job: --params {terms.model.n_params:,} is not what "
                                              f"scalelab-train builds for this shape ({built:,}); drop --params "
                                              "to plan that")
    for line in warned:
        print(f"warning: {line}", file=sys.stderr)
    if len(names) > 1:
        if not docs:        # no strategy of the list can run it: the first reason, as for one strategy
            raise PlanError(refused[0]["refused"])
        # a row that does not fit as asked may fit with a smaller micro-batch or checkpointing
        # (the split only differs: nd's 4 micro-batches fit a 7B model where fsdp's one did not)
        for doc, (terms, hw, _) in zip(docs, plans):
            if not doc["memory"]["fits"]:
                near = nearest_fitting(terms, hw, limit=1, only=SAME_STRATEGY_AND_DEVICES)
                doc["fits_with"] = near[0] if near else None
        order = {n: i for i, n in enumerate(names)}     # the refused rows in the listing's order
        docs = sorted(docs + refused, key=lambda d: order.get(d["inputs"]["strategy"], len(order)))
        print(json.dumps(docs, indent=2) if a.json else render_rows(docs) + _fits_with_note(docs))
        planned = [d for d in docs if d.get("memory")]
        if not any(d["memory"]["fits"] for d in planned):
            # as one strategy that does not fit (`--strategy ddp,single` for a 70B model exited 0)
            host = any(d["memory"]["total_bytes_per_device"] <= d["memory"]["device_memory_bytes"] for d in planned)
            print(f"error: none of {', '.join(d['inputs']['strategy'] for d in planned)} fits "
                  f"{'device or host' if host else 'device'} memory as asked (the rows above)", file=sys.stderr)
            return 1
        return 0
    doc, (terms, hw, _) = docs[0], plans[0]
    if not doc["memory"]["fits"]:
        doc["alternatives"] = nearest_fitting(terms, hw)
    print(json.dumps(doc, indent=2) if a.json else render(doc))
    if not doc["memory"]["fits"]:
        print(f"error: {render_alternatives(doc, doc['alternatives'])}", file=sys.stderr)
        return 1
    return 0


def _attention_what_if(model: ModelSpec, device: str) -> bool:
    """--attention other than the kernel the trainer's GPT gets on this kind of device: a plan of
    a job scalelab-train does not run (`--attention math` printed a same job with 2 GiB less)."""
    return model.kind == "gpt" and model.attention != sdpa_kernel(device, model.dropout)


def _refused(name: str | None, exc: PlanError, listed: int) -> dict:
    """A strategy the trainer would refuse for this job (tp 8 and vocab 50257): alone, its one-line
    error; in a listing, a row saying so instead of figures for a job that cannot run."""
    if listed == 1:
        raise exc
    # the figures' keys of a planned row, null: a reader of the list finds them on every row
    return {"inputs": {"strategy": name}, "refused": str(exc), "memory": None, "time": None}


def _fits_with_note(docs: list[dict]) -> str:
    from .report import tight_mark

    lines = []
    rows = [(d["inputs"]["strategy"], d["fits_with"]) for d in docs if "fits_with" in d]
    if rows:
        lines += ["", "does not fit as asked; on the same devices:"]
    for name, f in rows:
        mem = next(d["memory"] for d in docs if d["inputs"]["strategy"] == name)
        lines.append(f"  {name}: " + (f"fits with {f['change']} ({fmt_bytes(f['total_bytes'])} per device"
                                      f"{tight_mark(f['total_bytes'], mem)}, step {fmt_time(f['step_s'])})"
                                      if f else "no micro-batch or checkpointing fits"))
    refused = [d for d in docs if "refused" in d]
    if refused:
        lines += ["", "cannot run this job (scalelab-train refuses it):"]
        lines += [f"  {d['inputs']['strategy']}: " + d["refused"].removeprefix(f"strategy={d['inputs']['strategy']}: ")
                  for d in refused]
    return "\n".join(lines)

"""`scalelab recommend`: argparse wiring (add_arguments / run).

    scalelab recommend (--model NAME | --params N | --layers L --hidden H --heads A [--vocab V --seq-len S])
                       --devices D [--nodes N] [--hardware PROFILE] [--global-batch B[,B...]] [--tokens T]
                       [--budget-minutes M] [--objective throughput|cost|time-to-tokens] [--verify K]
                       [--strategies a,b|all] [--precision P[,P]] [--optimizer adam|sgd] [--out DIR] ...
    scalelab recommend --published megatron|zero|all      the published configurations, side by side

Every input is checked (one line, exit 2) before anything is planned or run; the planner's search
runs in this process; `--verify` runs real jobs through `scalelab-train -m` (recommend/verify.py).
"""
from __future__ import annotations

import argparse
import json
import math
import shlex
import sys
import time
from pathlib import Path

from scalelab.plan.peak_memory import HEADROOM
from scalelab.plan.spec import PlanError

from .rank import OBJECTIVES


def add_arguments(p: argparse.ArgumentParser) -> None:
    from scalelab.plan.cli import _count

    m = p.add_argument_group("model (--model, or --params, or the shape)")
    m.add_argument("--model", help="a model config in conf/model/ (gpt_small, ...)")
    m.add_argument("--params", type=_count, help="parameter count (7e9, 7B): GPT shape guessed")
    for flag in ("--layers", "--hidden", "--heads", "--vocab", "--seq-len", "--ffn-hidden"):
        m.add_argument(flag, type=int)
    j = p.add_argument_group("devices and batch")
    j.add_argument("--devices", type=int, default=1, help="devices per node (default 1)")
    j.add_argument("--nodes", type=int, default=1)
    j.add_argument("--hardware", default="this_cpu",
                   help="profile in conf/hardware/ or a .yaml path (default this_cpu)")
    j.add_argument("--global-batch", help="sequences per optimizer step; a comma list searches several "
                                          "(default: the trainer's data.global_batch_size, 16)")
    j.add_argument("--tokens", type=_count, help="tokens to train (time-to-tokens, cost, --budget-minutes)")
    j.add_argument("--budget-minutes", type=float,
                   help="with --tokens: layouts predicted to finish within it rank first")
    s = p.add_argument_group("search")
    s.add_argument("--objective", default="throughput", help=" | ".join(OBJECTIVES))
    s.add_argument("--strategies", help="comma list or `all` (default: every strategy that computes exact "
                                        "gradients; `all` adds ddp_compress, ddp_powersgd, local_sgd)")
    s.add_argument("--precision", help="comma list of 32, bf16-mixed, fp16-mixed, bf16-true (default: 32 on a CPU profile, "
                                       "bf16-mixed on a GPU one)")
    s.add_argument("--optimizer", default="adam", help="adam (AdamW) or sgd")
    s.add_argument("--activation-checkpointing", default="none,selective,full", help="comma list")
    s.add_argument("--memory-headroom", type=float, default=HEADROOM,
                   help=f"fraction of device memory kept free for the allocator's slack (default {HEADROOM})")
    s.add_argument("--top", type=int, default=10, help="strategies shown (default 10)")
    v = p.add_argument_group("verification and LR")
    v.add_argument("--verify", type=int, default=0, metavar="K", help="run the top K as short real jobs and re-rank")
    v.add_argument("--verify-steps", type=int, help="optimizer steps per verification job (default 20)")
    v.add_argument("--verify-repeats", type=int,
                   help="runs per candidate, interleaved (seeds); the median is ranked (default 1; give 3 on a shared host, where one short run varies 10-25 %%)")
    v.add_argument("--base-lr", type=float, help="LR at --base-batch (default: conf/optim's lr)")
    v.add_argument("--base-batch", type=int, help="batch --base-lr was tuned at (default: lr_scaling's 16)")
    v.add_argument("--lr-check", help="grid (three runs, default with --verify) | none")
    v.add_argument("--lr-steps", type=int, help="optimizer steps per LR-check job (default 30)")
    v.add_argument("--slurm", action="store_true",
                   help="verify through SLURM: one sbatch job per candidate (hydra/launcher=slurm)")
    v.add_argument("--train-arg", action="append", default=[], metavar="KEY=VALUE",
                   help="extra scalelab-train override for every verification job (repeatable)")
    o = p.add_argument_group("output")
    o.add_argument("--out", help="output dir (default outputs/recommend/<time>)")
    o.add_argument("--json", action="store_true", help="print recommendation.json instead of the tables")
    o.add_argument("--published", help="megatron | zero | all: recommend for the published configurations "
                                       "and print the predicted throughput next to the published one")


def run(args: argparse.Namespace) -> int:
    try:
        if args.published:
            from .published import run_published

            return run_published(args.published, args.json)
        req, opts = _request(args)
    except PlanError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    from .recommend import recommend

    try:
        doc = recommend(req, **opts)
    except PlanError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    if args.json:
        print(json.dumps(doc, indent=2, default=str))
    return 0 if doc.get("winner") else 1


def _list(text: str, flag: str, valid=None, cast=str) -> tuple:
    items = [t.strip() for t in str(text).split(",") if t.strip()]
    out = []
    for t in items:
        try:
            v = cast(t)
        except ValueError:
            raise PlanError(f"{flag} {t!r} is not a {cast.__name__}") from None
        if valid is not None and v not in valid:
            raise PlanError(f"{flag} {t!r} is not valid; valid: {', '.join(valid)}")
        out.append(v)
    if not out:
        raise PlanError(f"{flag} is empty")
    return tuple(out)


def _request(a: argparse.Namespace):
    """The search request and run options from the flags; every bad value is one PlanError line."""
    from scalelab.plan.cli import _model_from_args
    from scalelab.plan.hardware import load_hardware
    from scalelab.plan.spec import CHECKPOINTING, normalize_optimizer, normalize_precision

    from .lr import base_lr_caveat
    from .space import Request, check_batches, check_runnable, strategy_list

    if a.objective not in OBJECTIVES:
        raise PlanError(f"--objective {a.objective!r} is not valid; valid: {', '.join(OBJECTIVES)}")
    # flags of the verification's runs: given without --verify they did nothing, exit 0, without a word
    given = [flag for flag, attr, _ in VERIFY_ONLY if getattr(a, attr) not in (None, False)]
    for _, attr, default in VERIFY_ONLY:
        if getattr(a, attr) is None:
            setattr(a, attr, default)
    for flag, v, low in (("--devices", a.devices, 1), ("--nodes", a.nodes, 1), ("--verify", a.verify, 0),
                         ("--verify-steps", a.verify_steps, 8),
                         ("--verify-repeats", a.verify_repeats, 1), ("--lr-steps", a.lr_steps, 8), ("--top", a.top, 1)):
        if v is None or v < low:
            raise PlanError(f"{flag} must be >= {low}, got {v}")
    if a.objective == "time-to-tokens" and not a.tokens:
        raise PlanError("--objective time-to-tokens needs --tokens T (tokens to train)")
    # nan passed `nan <= 0` (a budget every layout met, exit 0), inf an LR of inf in the command
    _finite("--budget-minutes", a.budget_minutes, "a finite number of minutes > 0", lambda v: v > 0)
    _finite("--base-lr", a.base_lr, "a finite number > 0", lambda v: v > 0)
    _finite("--memory-headroom", a.memory_headroom, "a fraction in [0, 1)", lambda v: 0 <= v < 1)
    if a.budget_minutes is not None and not a.tokens:
        raise PlanError(f"--budget-minutes {a.budget_minutes} needs --tokens T (the tokens to train within it)")
    if a.lr_check not in ("grid", "none"):
        raise PlanError(f"--lr-check {a.lr_check!r} is not valid; valid: grid, none")
    if given and not a.verify:
        raise PlanError(f"{given[0]} sets the verification's runs, and there are none without --verify K: add "
                        f"--verify K (the top K as short runs) or drop {given[0]}")
    ns = argparse.Namespace(**{**vars(a), "attention": "flash", "dropout": None})
    model = _model_from_args(ns)
    if a.params is not None and a.model is None and model.kind == "gpt" and not model.shape_inferred:
        model = _shape_for_params(a, ns)
    if model.kind == "gpt" and model.ffn % model.hidden:   # every layout's command failed after the search
        raise PlanError(f"--ffn-hidden {model.ffn} is not a multiple of --hidden {model.hidden}: scalelab-train builds "
                        f"the MLP width as model.arch.mlp_ratio (an integer) x d_model; valid: {model.hidden}, "
                        f"{2 * model.hidden}, {3 * model.hidden}, ... (default 4 x hidden = {4 * model.hidden})")
    hw = load_hardware(a.hardware)
    opt = normalize_optimizer(a.optimizer)
    cpu = hw.kind == "cpu"     # not the name: a cpu profile `workstation` got bf16 and a GPU check
    precisions = tuple(normalize_precision(p) for p in _list(a.precision or ("32" if cpu else "bf16-mixed"),
                                                              "--precision"))
    if cpu and "fp16-mixed" in precisions:   # every layout "refused by the trainer", then exit 1 (review)
        raise PlanError(f"--precision {a.precision}: fp16 mixed precision needs a GPU (the trainer refuses it on CPU), "
                        f"and --hardware {a.hardware} is a CPU profile; valid there: 32, bf16-mixed, bf16-true")
    ckpt = _list(a.activation_checkpointing, "--activation-checkpointing", CHECKPOINTING)
    batches = _list(a.global_batch or str(_default_batch()), "--global-batch", cast=int)
    if any(b < 1 for b in batches):
        raise PlanError(f"--global-batch must be >= 1, got {min(batches)}")
    base_lr, base_batch = _lr_base(a, opt)
    req = Request(model, a.model, hw, hw.name, a.devices, a.nodes, batches, precisions, opt,
                  strategy_list(a.strategies), ckpt, smaller_worlds=a.objective == "cost",
                  headroom=a.memory_headroom, params_asked=a.params)
    check_runnable(req)
    check_batches(req)
    if a.verify and (a.nodes > 1) and not a.slurm:
        raise PlanError(f"--verify on --nodes {a.nodes} needs --slurm (multi-node jobs run under SLURM)")
    if a.verify and cpu is False and not a.slurm:
        import shutil

        if shutil.which("nvidia-smi") is None:
            raise PlanError(f"--verify with --hardware {a.hardware} needs its GPUs here or --slurm; "
                            "on this machine use --hardware this_cpu")
    out = Path(a.out) if a.out else Path("outputs/recommend") / time.strftime("%Y-%m-%d_%H-%M-%S")
    from scalelab.paths import path_problem

    problem = path_problem(out, "--out", folder=True)   # before any planning or run (it was a traceback after)
    if problem:
        raise PlanError(problem)
    held = sorted(p.name for p in out.iterdir()) if out.is_dir() else []
    if held:   # an earlier recommendation there was replaced without a word
        raise PlanError(f"--out {out} is not empty ({', '.join(held[:3])}{', ...' if len(held) > 3 else ''}): "
                        "give a new or empty folder, so that nothing recorded there is replaced")
    from .verify import check_train_args

    extra = list(a.train_arg)
    check_train_args(extra, req, a.verify_steps if a.verify else None, a.slurm)
    opts = dict(objective=a.objective, tokens=a.tokens, budget_s=a.budget_minutes * 60 if a.budget_minutes else None,
                verify=a.verify, verify_steps=a.verify_steps, verify_repeats=a.verify_repeats,
                lr_check=a.lr_check if a.verify else "none", lr_steps=a.lr_steps, base_lr=base_lr,
                base_batch=base_batch, slurm=a.slurm, extra=extra, top=a.top, out=out, quiet=a.json,
                lr_caveat=base_lr_caveat(model, opt, a.base_lr is not None))
    return req, opts


# (flag, attribute, default) of the options that only --verify's runs read
VERIFY_ONLY = (("--slurm", "slurm", False), ("--verify-steps", "verify_steps", 20), ("--verify-repeats", "verify_repeats", 1),
               ("--lr-check", "lr_check", "grid"), ("--lr-steps", "lr_steps", 30))


def _finite(flag: str, value, valid: str, ok) -> None:
    if value is not None and not (math.isfinite(value) and ok(value)):
        raise PlanError(f"{flag} {value} is not valid: give {valid}")


def _shape_for_params(a, ns):
    """The whole shape with --params: the shape the trainer builds, when --params is its count up
    to rounding (1 %: 7B for 7.06B, 29.4M for 29,406,720); else one PlanError. Planned at 7e9 and
    printed as a command building the shape's 29.4M, the recommendation was for another model
    (`scalelab plan` says "no same job" for the same flags; recommend's answer is a command)."""
    from scalelab.plan.cli import _model_from_args

    built = _model_from_args(argparse.Namespace(**{**vars(ns), "params": None}))
    if abs(built.n_params - a.params) > 0.01 * built.n_params:
        raise PlanError(f"--params {a.params:,.0f} is not the count of --layers {a.layers} --hidden {a.hidden} "
                        f"--heads {a.heads} (vocab {built.vocab}, seq {built.seq_len}): scalelab-train builds "
                        f"{built.n_params:,} parameters; give the shape alone, or --params alone (a shape is guessed)")
    return built


def _default_batch() -> int:
    import yaml

    from scalelab.plan.spec import conf_dir

    return int(yaml.safe_load((conf_dir() / "data" / "stdlib.yaml").read_text())["global_batch_size"])


def _lr_base(a, opt: str) -> tuple[float, int]:
    from .lr import base_defaults

    lr, batch = base_defaults(opt)
    lr = a.base_lr if a.base_lr is not None else lr
    batch = a.base_batch if a.base_batch is not None else batch
    if not (lr > 0 and math.isfinite(lr)) or batch < 1:
        raise PlanError(f"--base-lr must be > 0 and --base-batch >= 1, got {lr} and {batch}")
    return lr, batch


def command_line(overrides: list[str]) -> str:
    """The command to copy: this environment's scalelab-train as it runs from here (paths.command:
    the bare name was 'command not found' without an activated venv)."""
    from scalelab.paths import command

    return command("scalelab-train") + " " + " ".join(shlex.quote(o) for o in overrides)

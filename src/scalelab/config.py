"""Turn a composed Hydra config into a validated JobSpec, before any rank starts.

Every check raises ConfigError with one line naming the bad value and what would be valid.
"""
from __future__ import annotations

import math
import os
import socket
import sys
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import hydra.utils
from omegaconf import DictConfig, OmegaConf, open_dict, read_write
from omegaconf.errors import OmegaConfBaseException

from scalelab.errors import ConfigError
from scalelab.scaling.batch import BatchPlan, derive_batch
from scalelab.scaling.lr import DECAYS, RULES, scaled_lr, warmup_steps
from scalelab.strategies.base import RunSpec, StrategyPlan
from scalelab.strategies.registry import choices

# ${mul:a,b,...} in configs, e.g. a weak-scaling global batch = devices x nodes x per-rank batch.
if not OmegaConf.has_resolver("mul"):
    OmegaConf.register_new_resolver("mul", lambda *xs: math.prod(int(x) for x in xs))

PRECISIONS = ("32-true", "32", "bf16-mixed", "16-mixed", "bf16-true")
LOGGERS = ("wandb", "csv", "none")
LAUNCHERS = ("local", "torchrun_local", "srun", "torchrun")
ACCELERATORS = ("auto", "cpu", "gpu", "cuda")


@dataclass
class JobSpec:
    plan: StrategyPlan
    run: RunSpec
    batch: BatchPlan
    lr: float
    seq_len: int


def resolve_accelerator(requested: str, launched: str | None = None) -> str:
    """"gpu" | "cpu" for trainer.accelerator. `launched`: the job's as its launcher resolved it
    (a rank's config: job.accelerator), which the rank uses rather than resolving `auto` again."""
    import torch

    if requested not in ACCELERATORS:
        raise ConfigError(f"trainer.accelerator={requested!r} is not known: choose one of {', '.join(ACCELERATORS)}")
    if launched is not None:
        return _as_launched(requested, launched)
    if requested == "auto":
        return "gpu" if torch.cuda.is_available() else "cpu"
    if requested in ("gpu", "cuda"):
        if not torch.cuda.is_available():
            raise ConfigError(f"trainer.accelerator={requested} but no CUDA device is visible: use auto or cpu")
        return "gpu"
    return "cpu"


def _as_launched(requested: str, launched: str) -> str:
    """Fixes (found by review): every rank resolved `auto` again, so on a node where CUDA failed
    to initialize its ranks silently took cpu / gloo while the others took NCCL, and the job hung
    until trainer.collective_timeout_s. A rank runs on what the launcher chose for the job, and
    stops at once, in one line naming its host, where that is a GPU it cannot see."""
    import torch

    if launched not in ("cpu", "gpu"):
        raise ConfigError(f"job.accelerator={launched!r} must be cpu or gpu (written by scalelab-train)")
    if launched == "gpu" and not torch.cuda.is_available():
        visible = os.environ.get("CUDA_VISIBLE_DEVICES")
        raise ConfigError(f"host {socket.gethostname()} sees no CUDA device"
                          + (f" (CUDA_VISIBLE_DEVICES={visible!r})" if visible is not None else "")
                          + f" but the job runs on GPUs (trainer.accelerator={requested}, resolved to gpu at "
                          "launch): this rank stops rather than run on cpu and gloo beside NCCL ranks; check "
                          "this node's GPUs and driver (nvidia-smi), or run the job with trainer.accelerator=cpu")
    return launched


def _int(cfg: DictConfig, key: str, minimum: int) -> int:
    value = OmegaConf.select(cfg, key)
    if not isinstance(value, int) or isinstance(value, bool) or value < minimum:
        raise ConfigError(f"{key}={value!r} must be an integer >= {minimum}")
    return value


def _one_of(value: Any, key: str, valid) -> None:
    if value not in valid:
        raise ConfigError(f"{key}={value!r} is not valid: choose one of {', '.join(map(str, valid))}")


def model_arch(cfg: DictConfig) -> Any:
    try:
        return hydra.utils.instantiate(cfg.model.arch)
    except Exception as e:  # noqa: BLE001 - report which model config failed, in one line
        raise ConfigError(f"model={cfg.model.get('name')}: {_one_line(e)}") from e


def build_plan(cfg: DictConfig) -> StrategyPlan:
    try:
        return hydra.utils.instantiate(cfg.strategy, _convert_="all")
    except Exception as e:  # noqa: BLE001
        cause = e.__cause__ or e
        if isinstance(cause, ConfigError):
            raise cause from e
        raise ConfigError(f"strategy={cfg.strategy.get('name')}: {_one_line(e)}") from e


def _one_line(e: Exception) -> str:
    """Hydra's instantiate error (or its cause) as one line: an unloadable _target_'s message
    spans lines ("Error loading 'x.Y':" / ModuleNotFoundError(...) / "Are you sure ...")."""
    cause = e.__cause__ or e
    return " ".join(ln.strip() for ln in str(cause).splitlines() if ln.strip())[:400]


def _validation(cfg: DictConfig) -> int | None:
    """data.val_fraction, trainer.val_every_n_steps / val_batches and a hub dataset's name;
    returns val_every_n_steps (None: no validation)."""
    frac = OmegaConf.select(cfg, "data.val_fraction", default=0.02)
    if isinstance(frac, bool) or not isinstance(frac, (int, float)) or not 0 <= frac < 1:
        raise ConfigError(f"data.val_fraction={frac!r} must be a number in [0, 1): the share of the corpus's "
                          "token blocks held out for validation (default 0.02; 0: no val split)")
    every = OmegaConf.select(cfg, "trainer.val_every_n_steps", default=None)
    if every is not None:
        every = _int(cfg, "trainer.val_every_n_steps", 1)
        _int(cfg, "trainer.val_batches", 1)
        if frac == 0:
            raise ConfigError(f"trainer.val_every_n_steps={every} needs a val split: data.val_fraction is 0")
    if cfg.data.source == "hub":
        from scalelab.data.corpus import hub_kind

        hub_kind(str(cfg.data.hub_name))
    return every


@contextmanager
def _dynamo_left_unimported():
    """Build a throwaway optimizer without importing torch._dynamo. torch.optim.Optimizer's
    add_param_group (called by every optimizer's __init__) is wrapped by torch._disable_dynamo,
    whose first call imports torch._dynamo to make a non-compiled copy of it: 2.9 s of CPU in a
    launcher that compiles nothing (cProfile of preflight: 3.75 s, 2.9 s of it that import),
    paid again by the ranks' fork server, which imports it with Lightning. For the duration of
    the check, each such wrapper of Optimizer's finds its own plain function in the cache it
    fills on first call, so it calls that directly; the cache is emptied after, so the process
    (if it ever builds a real optimizer) gets torch's behaviour. A torch whose wrapper works
    otherwise just pays the import."""
    import torch

    if "torch._dynamo" in sys.modules:
        yield
        return
    plain = [m.__wrapped__ for m in vars(torch.optim.Optimizer).values()
             if callable(m) and hasattr(m, "__wrapped__")
             and getattr(getattr(m, "__code__", None), "co_qualname", "") == "_disable_dynamo.<locals>.inner"
             and getattr(m.__wrapped__, "__dynamo_disable", None) is None]
    for fn in plain:
        fn.__dynamo_disable = fn
    try:
        yield
    finally:
        for fn in plain:
            del fn.__dynamo_disable


def build_optimizer(cfg: DictConfig, lr: float) -> None:
    """Build the job's optimizer (optim.optimizer, a hydra `_partial_`) on one dummy parameter at
    the job's LR, so the values torch.optim checks (lr, betas, eps, momentum, weight_decay, ...)
    fail here, in one line, and not in every rank."""
    import torch

    try:
        factory = hydra.utils.instantiate(cfg.optim.optimizer)
        with _dynamo_left_unimported():
            factory([torch.nn.Parameter(torch.zeros(1))], lr=lr)
    except Exception as e:  # noqa: BLE001 - torch's ValueError / TypeError, as one line
        cause = e
        while cause.__cause__ is not None:
            cause = cause.__cause__
        why = next((ln.strip() for ln in str(cause).splitlines() if ln.strip()), type(cause).__name__)
        raise ConfigError(f"optim={cfg.optim.get('name')}: optim.optimizer "
                          f"({cfg.optim.optimizer.get('_target_')}) refused its arguments: {why}") from e


WARMUP_KEY = "trainer.warmup_steps"


def warmup_given(overrides) -> bool:
    """Whether the command line (a job's overrides) sets trainer.warmup_steps itself."""
    return any(str(o).split("=", 1)[0].lstrip("+~") == WARMUP_KEY for o in overrides)


def smoke_warmup(cfg: DictConfig, given: bool) -> str | None:
    """A smoke run (trainer.max_steps=1..5) under the config's default trainer.warmup_steps (5):
    the measurement warm-up is lowered to max_steps - 1 (0 for one step) in CFG, and the returned
    line says so; None where nothing changed. `scalelab-train trainer.max_steps=5` was refused over
    a value the user never set. Where the user gave both (given), validate refuses the pair."""
    steps, warm = OmegaConf.select(cfg, "trainer.max_steps"), OmegaConf.select(cfg, WARMUP_KEY)
    ints = all(isinstance(v, int) and not isinstance(v, bool) for v in (steps, warm))
    if given or not ints or not 1 <= steps <= warm:
        return None
    with read_write(cfg), open_dict(cfg):
        OmegaConf.update(cfg, WARMUP_KEY, steps - 1)
    return (f"[scalelab] warning: trainer.max_steps={steps} is not more than the default {WARMUP_KEY}={warm}: "
            f"this run excludes {steps - 1} warm-up step(s) from its figures instead ({WARMUP_KEY}={steps - 1}), "
            "and its few measured steps are not steady-state (short_run)")


def warmup_when_longer(cfg) -> int:
    """The warm-up a longer run of CFG excludes: its own, or, where smoke_warmup lowered the default
    to max_steps - 1, the trainer's default (conf/trainer/) that applies again once max_steps
    exceeds it. The short-run hint said 'max_steps >= 7' after 3 steps, and 7 steps said '>= 10'."""
    warm, steps = int(OmegaConf.select(cfg, WARMUP_KEY) or 0), int(OmegaConf.select(cfg, "trainer.max_steps") or 0)
    if warm != steps - 1:
        return warm
    import yaml

    from scalelab.plan.cli_job import trainer_default

    try:
        default = int(trainer_default("trainer", "warmup_steps"))
    except (OSError, TypeError, ValueError, yaml.YAMLError):   # unreadable, or no such default: its own
        return warm
    return max(warm, default)


def validate(cfg: DictConfig, target: str | None = None) -> JobSpec:
    """All checks that can run without starting a rank. `target` ("cpu" | "gpu"): validate a job
    for that kind of device elsewhere (`scalelab plan`), without asking this machine for devices
    or a SLURM allocation. Any bad value is a ConfigError (one line), never another exception."""
    try:
        return _validate(cfg, target)
    except ConfigError:
        raise
    except Exception as e:  # noqa: BLE001 - a value of a type no check foresaw: one line, not a traceback
        raise ConfigError(f"invalid config: {type(e).__name__}: {str(e).splitlines()[0] if str(e) else ''}") from e


def _validate(cfg: DictConfig, target: str | None = None) -> JobSpec:
    try:
        resolved = OmegaConf.to_container(cfg, resolve=True, throw_on_missing=True)
    except OmegaConfBaseException as e:
        key = getattr(e, "full_key", "") or "config"
        raise ConfigError(f"{key}: {str(e).splitlines()[0]} (set it on the command line)") from e
    from scalelab import schema

    schema.check(resolved)  # every key's type and range (schema.py), before the cross-key checks below
    for group, key in (("strategy", "strategy.name"), ("model", "model.name"), ("optim", "optim.name")):
        _one_of(OmegaConf.select(cfg, key), key, choices(group))
    devices = _int(cfg, "trainer.devices", 1)
    nodes = _int(cfg, "trainer.num_nodes", 1)
    max_steps = _int(cfg, "trainer.max_steps", 1)
    threads = OmegaConf.select(cfg, "trainer.threads_per_rank")
    if threads not in (None, "auto") and (not isinstance(threads, int) or isinstance(threads, bool) or threads < 1):
        raise ConfigError(f"trainer.threads_per_rank={threads!r} must be null (1 on CPU, cores / ranks on GPU), "
                          "auto (cores / ranks) or an integer >= 1")
    warm = _int(cfg, "trainer.warmup_steps", 0)
    if warm >= max_steps:   # both given (a default one is lowered first: smoke_warmup)
        raise ConfigError(f"trainer.warmup_steps={warm} must be < trainer.max_steps={max_steps} "
                          "(warm-up steps are excluded from the measured figures): set "
                          f"trainer.warmup_steps={max_steps - 1}{' or less' if max_steps > 1 else ''}")
    _one_of(str(cfg.trainer.precision), "trainer.precision", PRECISIONS)
    _one_of(cfg.logger.name, "logger.name", LOGGERS)
    _one_of(cfg.launcher.name, "launcher.name", LAUNCHERS)
    # extra arguments after the launcher's own: argparse keeps the last value, so
    # ["--rdzv-backend=c10d"] undid the static rendezvous (rank 0, the record's writer, on any node)
    # and ["--ntasks=3"] the layout srun was checked for
    own = {"torchrun": ("--nnodes", "--node-rank", "--node_rank", "--nproc-per-node", "--nproc_per_node", "--rdzv",
                        "--max-restarts", "--max_restarts", "--standalone", "--master"),
           "srun": ("--nodes", "--ntasks", "--ntasks-per-node", "--distribution", "--kill-on-bad-exit", "--export",
                    "-N", "-n")}.get(cfg.launcher.name, ())
    taken = next((a for a in (OmegaConf.select(cfg, "launcher.extra_args") or [])
                  if own and str(a).split("=", 1)[0].startswith(own)), None)
    if taken is not None:
        raise ConfigError(f"launcher.extra_args has {taken!r}: launcher={cfg.launcher.name} sets it from the job's "
                          "layout (trainer.num_nodes / trainer.devices and the launcher keys); drop it")
    if nodes > 1 and cfg.launcher.name in ("local", "torchrun_local") and target is None:
        raise ConfigError(f"trainer.num_nodes={nodes} needs launcher=srun (inside a SLURM allocation; "
                          "see `scalelab slurm render`) or launcher=torchrun (plain hosts, Kubernetes: README "
                          "\"Several nodes without SLURM\"): the local launcher starts ranks on this machine only")
    if cfg.launcher.name == "torchrun":  # endpoint HOST:PORT, node rank in [0, nodes): from keys or environment
        from scalelab.launch import torchrun_layout

        torchrun_layout(cfg.launcher, nodes, require=target is None)
    # in a rank: the accelerator the launcher resolved for the whole job (train.run_job records it)
    accelerator = target or resolve_accelerator(cfg.trainer.accelerator, OmegaConf.select(cfg, "job.accelerator"))
    from scalelab.scaling.mfu import profile_name

    if target is None or cfg.get("hardware_profile", "auto") not in (None, "auto"):
        # (auto on another machine's GPU: its name is read there, by the ranks)
        profile_name(cfg.get("hardware_profile", "auto"), accelerator)
    if accelerator == "gpu" and target is None:
        import torch

        if cfg.launcher.name != "srun" and devices > torch.cuda.device_count():
            raise ConfigError(f"trainer.devices={devices} but only {torch.cuda.device_count()} GPU(s) are visible")
    if cfg.data.source == "files":
        from scalelab.data.tables import is_pattern
        from scalelab.data.text_files import pattern_refusal

        for f in cfg.data.files or []:
            if not Path(str(f)).expanduser().exists():   # a pattern's own line (it never showed: found by review)
                raise ConfigError(pattern_refusal(f) if is_pattern(str(f)) else
                                  f"data.files: {f!r} does not exist (give existing text files or folders)")
    val_every = _validation(cfg)
    arch = model_arch(cfg)
    seq_len = getattr(arch, "seq_len", None) or getattr(arch, "in_features")
    plan = build_plan(cfg)
    if val_every and hasattr(plan, "training_step"):
        raise ConfigError(f"trainer.val_every_n_steps={val_every} does not work with strategy={cfg.strategy.name}: its "
                          "schedule runs forward and backward itself in training_step and each rank holds one stage, "
                          "so Lightning's validation loop would run a stage as the whole model; set "
                          "trainer.val_every_n_steps=null")
    world = devices * nodes
    degrees = plan.parallel_degrees(world)
    micro = cfg.data.get("micro_batch_size")
    batch = derive_batch(_int(cfg, "data.global_batch_size", 1), degrees["dp"], micro)
    run = RunSpec(world_size=world, num_nodes=nodes, devices_per_node=devices, accelerator=accelerator,
                  precision=str(cfg.trainer.precision), model_arch=arch, batch=batch)
    plan.validate(run)
    if run.precision == "16-mixed" and accelerator == "cpu":   # after the strategies' own refusals
        # Lightning's accelerator connector runs it as bf16-mixed (one warning in ranks.log): the
        # record, its MFU and the plan said fp16 for a bf16 run (the plan: 10x its step time)
        raise ConfigError("trainer.precision=16-mixed on CPU: Lightning runs it as bf16-mixed there "
                          "(its fp16 AMP is GPU-only); give trainer.precision=bf16-mixed or 32-true")
    # after the strategy's own checks (nd names its tp option); for those that have none (tp, fsdp_tp)
    if nodes > 1 and degrees.get("tp", 1) > 1 and devices % degrees["tp"]:
        raise ConfigError(f"strategy={cfg.strategy.name}: tensor-parallel degree {degrees['tp']} does not divide "
                          f"trainer.devices={devices} (devices per node): a TP group must stay inside a node; "
                          + (f"use a TP degree that divides {devices}" if devices > 1 else
                             "with one device per node there is no TP group to make: a data-parallel strategy "
                             "(ddp, fsdp, zero1-3), or more devices per node"))
    ls = cfg.lr_scaling
    _one_of(ls.rule, "lr_scaling.rule", RULES)
    _one_of(ls.decay, "lr_scaling.decay", DECAYS)
    warmup_steps(ls.warmup_steps, max_steps)
    # single on N ranks: N replicas, each stepping on global / N samples (at the global batch's
    # LR each trained at 2x the linear rule's LR for its batch)
    lr_batch = batch.global_batch_size // world if plan.independent_replicas else batch.global_batch_size
    lr = scaled_lr(float(cfg.optim.lr), int(ls.base_batch_size), lr_batch, ls.rule)
    build_optimizer(cfg, lr)
    clip = cfg.trainer.get("gradient_clip_val")
    if (cfg.optim.optimizer.get("fused") is True and clip and str(cfg.trainer.precision) in ("bf16-mixed", "16-mixed")
            and not plan.clips_gradients_itself):
        # Lightning's MixedPrecision.clip_gradients raises at the first step for a fused optimizer
        # (it unscales gradients itself), bf16 too; ranks would start only to fail
        raise ConfigError(f"optim.optimizer.fused=true with trainer.gradient_clip_val={clip} under "
                          f"trainer.precision={cfg.trainer.precision}: Lightning's mixed precision cannot clip the "
                          f"gradients of a fused optimizer (strategy={cfg.strategy.name}); set "
                          "optim.optimizer.fused=null (torch's foreach kernels) or trainer.gradient_clip_val=null")
    return JobSpec(plan=plan, run=run, batch=batch, lr=lr, seq_len=int(seq_len))

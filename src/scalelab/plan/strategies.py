"""The planner's strategies: what each one shards, where it keeps things, and how it
communicates; refined by the strategy's config in conf/strategy/ and a run's own options."""
from __future__ import annotations

import functools
from dataclasses import dataclass, replace
from pathlib import Path

from .base import PlanError, conf_dir


# --------------------------------------------------------------------------------------------
# Strategies: what each one shards, where it keeps things, and how it communicates.
# --------------------------------------------------------------------------------------------
@dataclass(frozen=True)
class Strategy:
    name: str
    family: str                 # "torch" (autocast, fp32 weights), "fsdp", "deepspeed"
    shard_params: bool = False  # parameters partitioned at rest across the data-parallel group
    shard_grads: bool = False
    shard_optimizer: bool = False
    reshard_after_forward: bool = True  # FSDP FULL_SHARD / ZeRO-3 free gathered params after use
    zero_stage: int | None = None
    offload_optimizer: bool = False     # optimizer states (+ fp32 grads) live in host memory
    offload_params: bool = False
    tensor_parallel: bool = False
    pipeline: bool = False
    grad_comm_bytes: int = 0            # DDP comm hook fp16/bf16 -> 2 (0: the family's default)
    powersgd_rank: int = 0              # DDP PowerSGD hook (Vogels et al. 2019), 0 = off
    local_sgd_period: int = 0           # post-local SGD: params averaged every N steps, 0 = off
    grad_buckets: bool = False          # DDP: gradients live in its persistent buckets (bucket views)
    # tp at dp > 1: FSDP2's replicate per Block and the root, one all-reduce per unit a step (comm.py)
    replicate_units: bool = False
    default_tp: int = 0                 # tensor_parallel_size from the strategy config (0: auto)
    default_pp: int = 0                 # nd: pp from the strategy config (0: as many stages as fit)
    pipeline_split: str = "uniform"     # pipeline / nd `split`: uniform | balanced (flops.stage_layers)
    stages_per_rank: int = 1            # pipeline / nd interleaved_1f1b: virtual stages per rank
    pipeline_schedule: str = "1f1b"     # pipeline / nd `schedule`: gpipe | 1f1b | interleaved_1f1b
    dp_replicate: int = 1               # nd: replicated groups of the dp ranks (HSDP); FSDP shards over dp / this
    # ZeRO-3 keeps parameter tensors of fewer elements than this whole on every rank
    # (stage3_param_persistence_threshold; DeepSpeed's and Lightning's default 1e5)
    param_persistence_elements: int = 0
    # DeepSpeed's gradient reduce buckets (model_states.zero_bucket_bytes): reduce_bucket_size
    # elements, held whole with contiguous_gradients, twice with overlap_comm (ZeRO-1/2)
    reduce_bucket_elements: int = 200_000_000
    allgather_bucket_elements: int = 200_000_000     # ZeRO-1/2's parameter all-gather (comm.py)
    contiguous_gradients: bool = True
    overlap_comm: bool = True
    # ZeRO-3's parameter coordinator (plan/zero3_trace.py): what it keeps gathered from forward to
    # backward follows stage3_max_reuse_distance, stage3_prefetch_bucket_size,
    # stage3_max_live_parameters (DeepSpeed's defaults) and the fetch unit (conf/strategy/zero3.yaml)
    zero3_reuse_distance: int = 1_000_000_000
    zero3_prefetch_elements: int = 50_000_000
    zero3_max_live: int = 1_000_000_000
    zero3_fetch_unit: str = "module"    # DeepSpeed's (the runtime's without the key); zero3.yaml: block
    note: str = ""


def trainer_refuses(s: Strategy, precision: str, device: str) -> str | None:
    """Why scalelab-train refuses strategy S at PRECISION (normalized: 32, bf16-mixed, fp16-mixed,
    bf16-true) on a DEVICE kind ("cpu" | "gpu"), else None: its strategies' validate, restated (plan/
    imports no trainer code); tests/unit/test_plan_review_2.py checks every pair against the trainer's own."""
    if precision == "bf16-true" and s.family == "deepspeed":   # DeepSpeed keeps its own fp32 master copy
        return (f"strategy={s.name}: trainer.precision=bf16-true is not supported by DeepSpeed here: use bf16-mixed "
                "or 32")
    if precision != "fp16-mixed":
        return None
    if s.pipeline:   # pipeline, nd: the schedule's own backward
        return (f"trainer.precision=16-mixed is not supported by strategy={s.name}: it needs a loss scaler, which the "
                "pipeline schedule's own backward bypasses; use bf16-mixed or 32")
    if s.family == "fsdp" or s.tensor_parallel:   # FSDP2 / DTensor (Lightning's ModelParallelStrategy)
        return f"trainer.precision=16-mixed is not supported by strategy={s.name}: use bf16-mixed or 32"
    if s.family == "deepspeed" and device == "cpu":
        return f"strategy={s.name}: trainer.precision=16-mixed (DeepSpeed fp16) needs a GPU: use bf16-mixed or 32 on CPU"
    if device == "cpu":   # config.validate: Lightning would run it as bf16-mixed
        return ("trainer.precision=16-mixed on CPU: Lightning runs it as bf16-mixed there (its fp16 AMP is "
                "GPU-only); give trainer.precision=bf16-mixed or 32-true")
    return None


def model_refuses(s: Strategy, model_kind: str) -> str | None:
    """Why scalelab-train refuses strategy S for a model of MODEL_KIND ("gpt" | "mlp"), else None:
    tensor and pipeline parallelism split a GPT's heads and layers (strategies/tensor_parallel.py,
    pipeline.py); `plan --model mlp --strategy pipeline` planned every stage with the whole MLP and
    printed a same job the trainer refuses."""
    if model_kind == "gpt" or not (s.pipeline or s.tensor_parallel):
        return None
    how = "splits a GPT by layers" if s.pipeline else "tensor-parallelizes the GPT models only"
    return (f"strategy={s.name} {how}; the {model_kind} model is not one: "
            "choose a gpt model (--model gpt_nano, gpt_small, or the shape flags)")


STRATEGIES: dict[str, Strategy] = {s.name: s for s in [
    Strategy("single", "torch", note="one replica per device, no gradient sync"),
    Strategy("ddp", "torch", grad_buckets=True,
             note="replicate, all-reduce gradients (bucketed, overlapped with backward)"),
    Strategy("fsdp", "fsdp", True, True, True, note="FULL_SHARD: ZeRO-3-like, per-layer units"),
    Strategy("fsdp_grad_op", "fsdp", True, True, True, reshard_after_forward=False,
             note="SHARD_GRAD_OP: ZeRO-2-like, params stay gathered from forward to backward"),
    Strategy("zero1", "deepspeed", shard_optimizer=True, zero_stage=1),
    Strategy("zero2", "deepspeed", shard_grads=True, shard_optimizer=True, zero_stage=2),
    Strategy("zero3", "deepspeed", True, True, True, zero_stage=3, param_persistence_elements=100_000),
    Strategy("zero2_offload", "deepspeed", shard_grads=True, shard_optimizer=True, zero_stage=2,
             offload_optimizer=True),
    Strategy("zero3_offload", "deepspeed", True, True, True, zero_stage=3,
             offload_optimizer=True, offload_params=True, param_persistence_elements=100_000),
    Strategy("tp", "torch", tensor_parallel=True, replicate_units=True,
             note="Megatron tensor parallel (+ FSDP2 replicate per block over dp)"),
    Strategy("fsdp_tp", "fsdp", True, True, True, tensor_parallel=True,
             note="2D: tensor parallel inside, FSDP over the data-parallel dimension"),
    Strategy("pipeline", "torch", pipeline=True,
             note="1F1B pipeline (+ DDP stages over dp, reduced in the last micro-batch's backward)"),
    Strategy("nd", "fsdp", True, True, True, tensor_parallel=True, pipeline=True,
             note="3D: pipeline stages x tensor parallel inside a node x FSDP over dp, one mesh"),
    Strategy("ddp_compress", "torch", grad_comm_bytes=2, grad_buckets=True,
             note="DDP, buckets cast to bf16 for the all-reduce"),
    Strategy("ddp_powersgd", "torch", powersgd_rank=1, grad_buckets=True, note="DDP, PowerSGD low-rank gradients"),
    Strategy("local_sgd", "torch", local_sgd_period=4, grad_buckets=True,
             note="no gradient sync; params averaged every N steps"),
]}

# A config in conf/strategy/ that the table above does not name maps by its _target_ class.
_TARGETS = {"single.Single": "single", "ddp.DDP": "ddp", "fsdp.FSDP": "fsdp",
            "deepspeed.ZeRO": "zero2", "tensor_parallel.TensorParallel": "tp",
            "tensor_parallel.FSDPTensorParallel": "fsdp_tp", "nd.ND": "nd"}


def strategy_names() -> list[str]:
    d = conf_dir() / "strategy"
    confs = [p.stem for p in sorted(d.glob("*.yaml"))] if d.is_dir() else []
    return list(STRATEGIES) + [n for n in confs if n not in STRATEGIES]


def _strategy_config(name: str) -> dict:
    path = conf_dir() / "strategy" / f"{name}.yaml"
    if not path.is_file():
        return {}
    return dict(_read_yaml(str(path), path.stat().st_mtime_ns))


@functools.lru_cache(maxsize=64)
def _read_yaml(path: str, mtime_ns: int) -> dict:
    import yaml
    try:
        return yaml.safe_load(Path(path).read_text()) or {}
    except yaml.YAMLError:
        return {}


def as_applied(strategy: Strategy, dp: int) -> Strategy:
    """The strategy as it runs over `dp` data-parallel ranks: nd applies FSDP2 only when dp > 1
    (strategies/nd.py); at dp 1 its stages are plain modules (fp32 parameters and gradients,
    Lightning's autocast under bf16-mixed), planned like a torch strategy."""
    if strategy.family == "fsdp" and strategy.pipeline and dp == 1:
        return replace(strategy, family="torch", shard_params=False, shard_grads=False,
                       shard_optimizer=False, dp_replicate=1)
    return strategy


def get_strategy(name: str, options: dict | None = None) -> Strategy:
    """The planner's view of a strategy: the table above, refined by its config in conf/strategy/
    (comm hook, PowerSGD rank, local SGD period, ZeRO stage / offload, FSDP resharding, TP size)
    and then by `options` (e.g. a run's resolved `config.strategy`)."""
    cfg = {**_strategy_config(name), **(options or {})}
    if name in STRATEGIES:
        base = STRATEGIES[name]
    else:
        target = str(cfg.get("_target_", "")).rsplit(".", 2)
        key = ".".join(target[-2:]) if len(target) >= 2 else ""
        if key not in _TARGETS:
            raise PlanError(f"unknown strategy {name!r}; valid: {', '.join(strategy_names())}")
        base = replace(STRATEGIES[_TARGETS[key]], name=name)
    return _apply_options(base, cfg)


def _apply_options(st: Strategy, cfg: dict) -> Strategy:
    kw: dict = {}
    hook = cfg.get("comm_hook")
    if hook in ("fp16", "bf16"):
        kw["grad_comm_bytes"] = 2
    elif hook == "powersgd":
        kw["powersgd_rank"] = int(cfg.get("powersgd_rank") or 1)
    elif hook in ("none", None) and "comm_hook" in cfg:
        kw.update(grad_comm_bytes=0, powersgd_rank=0)
    if "local_sgd_period" in cfg:
        kw["local_sgd_period"] = int(cfg["local_sgd_period"] or 0)
    if st.family == "deepspeed" and cfg.get("stage") in (1, 2, 3):
        stage = int(cfg["stage"])
        kw.update(zero_stage=stage, shard_optimizer=True, shard_grads=stage >= 2, shard_params=stage == 3)
        if stage == 3 and not st.param_persistence_elements:
            kw["param_persistence_elements"] = 100_000
    if st.family == "deepspeed" and cfg.get("stage3_param_persistence_threshold") is not None:
        kw["param_persistence_elements"] = int(cfg["stage3_param_persistence_threshold"])
    for key, field_name in (("reduce_bucket_size", "reduce_bucket_elements"),
                            ("allgather_bucket_size", "allgather_bucket_elements"),
                            ("stage3_max_reuse_distance", "zero3_reuse_distance"),
                            ("stage3_prefetch_bucket_size", "zero3_prefetch_elements"),
                            ("stage3_max_live_parameters", "zero3_max_live")):
        if st.family == "deepspeed" and isinstance(cfg.get(key), int) and not isinstance(cfg.get(key), bool):
            kw[field_name] = int(cfg[key])
    if st.family == "deepspeed" and cfg.get("stage3_fetch_unit") in ("block", "module"):
        kw["zero3_fetch_unit"] = cfg["stage3_fetch_unit"]
    for key in ("contiguous_gradients", "overlap_comm"):
        if st.family == "deepspeed" and isinstance(cfg.get(key), bool):
            kw[key] = cfg[key]
    if st.family == "deepspeed" and "offload_optimizer" in cfg:
        kw["offload_optimizer"] = cfg["offload_optimizer"] not in (None, "none", False)
    if st.family == "deepspeed" and "offload_params" in cfg:
        kw["offload_params"] = cfg["offload_params"] not in (None, "none", False) and kw.get(
            "zero_stage", st.zero_stage) == 3
    if st.family == "fsdp" and "reshard_after_forward" in cfg:
        kw["reshard_after_forward"] = bool(cfg["reshard_after_forward"])
    if st.tensor_parallel and isinstance(cfg.get("tensor_parallel_size"), int):
        kw["default_tp"] = cfg["tensor_parallel_size"]
    if st.tensor_parallel and st.pipeline:   # nd: its degrees are `tp` and `pp`
        if isinstance(cfg.get("tp"), int) and not isinstance(cfg.get("tp"), bool):
            kw["default_tp"] = cfg["tp"]
        if isinstance(cfg.get("pp"), int) and not isinstance(cfg.get("pp"), bool):
            kw["default_pp"] = cfg["pp"]
    if st.pipeline and cfg.get("split") in ("uniform", "balanced"):
        kw["pipeline_split"] = cfg["split"]
    if st.pipeline and isinstance(cfg.get("stages_per_rank"), int) and not isinstance(cfg["stages_per_rank"], bool):
        kw["stages_per_rank"] = max(int(cfg["stages_per_rank"]), 1)
    if st.pipeline and cfg.get("schedule") in ("gpipe", "1f1b", "interleaved_1f1b"):
        kw["pipeline_schedule"] = cfg["schedule"]
    if st.family == "fsdp" and st.pipeline and isinstance(cfg.get("dp_replicate"), int) \
            and not isinstance(cfg["dp_replicate"], bool):
        kw["dp_replicate"] = max(int(cfg["dp_replicate"]), 1)
    return replace(st, **kw) if kw else st

"""`scalelab plan` from the trainer's own overrides: one vocabulary for a plan and a run.

    scalelab plan strategy=zero3 model=gpt_small trainer.devices=8 trainer.num_nodes=4 \
        data.global_batch_size=512 trainer.precision=bf16-mixed hardware_profile=h100_sxm

The overrides are composed by the same Hydra config and validated by the same code as
`scalelab-train` (config.validate), for the device kind of the hardware profile instead of this
machine's; the job is then described as a run record (results.record.base_record) and the
planner reads it exactly as it reads a measured run (plan.run_records.terms_from_run). So the
batch split (micro-batch x accumulation), the parallel degrees, precision, optimizer and
activation checkpointing of a plan are those the run would use. Lives outside plan/ because
it builds the training config (strategies, Hydra); plan/ stays free of them.
"""
from __future__ import annotations

import shlex

from scalelab.errors import ConfigError
from scalelab.plan.spec import PlanError


def terms_for_job(overrides: list[str], target: str | None = None):
    """(planner Terms, hardware profile name) for the job `scalelab-train OVERRIDES` describes.
    target ("cpu" | "gpu"): the device kind of the profile planned on, where the caller knows it
    (recommend: a GPU profile given as a .yaml path is no trainer choice, so the overrides carry no
    hardware_profile= and the job was validated as a CPU one: DeepSpeed fp16 refused); else read
    from hardware_profile (unset: this machine's CPU)."""
    from omegaconf import OmegaConf

    from scalelab.models.build import count_parameters
    from scalelab.plan.run_records import terms_from_run
    from scalelab.results.record import base_record

    cfg, spec, target, hardware = _validated(overrides, target)
    resolved = OmegaConf.to_container(cfg, resolve=True)
    world = spec.run.world_size
    n_params = count_parameters(spec.run.model_arch)
    from scalelab.launch import threads_per_rank

    threads = threads_per_rank(cfg.trainer.threads_per_rank, spec.run.devices_per_node, target)
    record = base_record(resolved, spec.batch, spec.lr, world, spec.plan.parallel_degrees(world),
                         spec.run.model_arch, n_params, target, threads)
    # the trainer frees gradients after each optimizer step (models/lit.py frees_grads_after_step,
    # recorded so by every run): without the flag the planner reads the record as an old run's and
    # holds the gradients through the peak (a pipeline's and DeepSpeed's are decided by their layout)
    record["memory"]["grads_freed_after_step"] = True
    if getattr(spec.plan, "microbatches", None):  # a pipeline cuts the per-rank batch into these
        record["parallel"]["microbatches"] = int(spec.plan.microbatches)
    return terms_from_run(record), hardware


_ONE_JOB = "a plan is of one job; give each of those keys one value"


def check_job(overrides: list[str], target: str, one_job: str = _ONE_JOB) -> None:
    """Compose and validate `scalelab-train OVERRIDES` for a `target` device, as terms_for_job does,
    without planning it; a bad value is one PlanError line (recommend's --train-arg, before its search)."""
    _validated(overrides, target, one_job)


def _validated(overrides: list[str], target: str | None, one_job: str = _ONE_JOB):
    """(composed config, JobSpec, target, hardware profile name) of one job; PlanError if invalid.
    An experiment that sweeps (experiment=strategy_scaling) is refused, ONE_JOB saying why: its
    config's first values were planned, and the same-job line printed a command scalelab-train refuses."""
    from hydra import initialize_config_dir
    from hydra.core.global_hydra import GlobalHydra

    from omegaconf import open_dict

    from scalelab.config import smoke_warmup, validate, warmup_given
    from scalelab.paths import conf_dir
    from scalelab.preflight import sweep_left
    from scalelab.preflight_parse import compose_job, override_parser, parse
    from scalelab.scaling.mfu import is_cpu_profile, profile_name

    if any(("," in o.split("=", 1)[-1] and not o.split("=", 1)[-1].startswith("[")) for o in overrides):
        raise PlanError("one job at a time: a sweep value (a,b) is not a plan; use --strategy a,b for strategies")
    GlobalHydra.instance().clear()
    try:
        with initialize_config_dir(config_dir=str(conf_dir()), version_base="1.3"):
            parse(override_parser(), overrides)   # a parse error: one line naming the override (as preflight's)
            cfg = compose_job(overrides, hydra_cfg=True)
        swept = sweep_left(cfg, overrides)
        if swept:
            raise ConfigError(f"{swept}: {one_job}")
        with open_dict(cfg):
            cfg.pop("hydra")
        smoke_warmup(cfg, warmup_given(overrides))   # trainer.max_steps=3 under the default warm-up: as scalelab-train
        requested = cfg.get("hardware_profile", "auto")
        if target is None:
            target = "cpu" if requested in (None, "auto") or is_cpu_profile(str(requested)) else "gpu"
        spec = validate(cfg, target=target)
        # auto on a GPU elsewhere: its name is read there (profile_name would ask this machine's CUDA)
        unnamed_gpu = requested in (None, "auto") and target == "gpu"
        hardware = None if unnamed_gpu else profile_name(requested, target)
        # validate() checks the launcher only for this machine (target None); a named local launcher
        # on several nodes is refused by scalelab-train, so it is no plan. Unnamed, the same-job line
        # adds launcher=srun (plan/cli.py).
        named = any(o.lstrip("+").startswith("launcher=") for o in overrides)
        if spec.run.num_nodes > 1 and named and cfg.launcher.name in ("local", "torchrun_local"):
            raise ConfigError(f"trainer.num_nodes={spec.run.num_nodes} needs launcher=srun or launcher=torchrun: "
                              f"scalelab-train refuses launcher={cfg.launcher.name} on several nodes")
    except ConfigError as e:
        raise PlanError(str(e)) from e
    finally:
        GlobalHydra.instance().clear()
    return cfg, spec, target, hardware


def train_command(overrides: list[str]) -> str:
    return "scalelab-train " + " ".join(shlex.quote(o) for o in overrides)

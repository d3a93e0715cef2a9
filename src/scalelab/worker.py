"""One rank: build data, model and strategy from the job's resolved config, fit, measure.

Run as `python -m scalelab.worker JOB_DIR` by torchrun (TorchElasticEnvironment) or srun
(SLURMEnvironment); Lightning reads the rank layout from that environment and launches nothing.
Rank 0 writes JOB_DIR/run.json. Any rank that fails writes JOB_DIR/error-rank<R>.txt.
"""
from __future__ import annotations

import gc
import os
import sys
import time
import traceback
from datetime import timedelta
from pathlib import Path

from scalelab import requeue

requeue.install_early()  # before the heavy imports: a SLURM warning signal must not kill a starting rank

import hydra.utils  # noqa: E402
import lightning as L
import torch
import torch.distributed as dist
from omegaconf import OmegaConf

from scalelab import timing  # noqa: E402
from scalelab.checkpointing import (RESUMED, checkpoint_step, note_restart, periodic_checkpoint, read_curve, resume_point,
                                    write_step)
from scalelab.config import validate
from scalelab.console import StepProgressBar, quiet_rank
from scalelab.data.datamodule import ByteCorpusDataModule, ValidationCurve, validation_trainer_args
from scalelab.launch import host_cores
from scalelab.models.gpt import num_params
from scalelab.models.lit import LitModule
from scalelab.strategies.base import without_teardown_copies
from scalelab.results.record import RUN_FILE, base_record, lr_rule_label, scrub, write_json
from scalelab.scaling.breakdown import ProfileWindow, combine
from scalelab.scaling.mfu import compute_mfu, load_profile
from scalelab.scaling.metrics import MIN_MEASURED_STEPS, StepMetrics, gather_all, summarize


def _global_rank() -> int:
    return int(os.environ.get("RANK", os.environ.get("SLURM_PROCID", 0)))


def _local_rank() -> int:
    return int(os.environ.get("LOCAL_RANK", os.environ.get("SLURM_LOCALID", 0)))


def build_logger(cfg, job_dir: Path, resumed: bool = False):
    kind = cfg.logger.name
    if kind == "none":
        return False
    if kind == "csv":
        from lightning.pytorch.loggers import CSVLogger

        # a resumed attempt writes csv/attempt-N/metrics.csv: in csv/ itself Lightning deletes the
        # earlier attempts' metrics.csv ("Previous log files ... will be deleted": a resume at step
        # 500 left steps 500-600 of 600)
        version = ""
        if resumed and (job_dir / "csv" / "metrics.csv").exists():
            version = f"attempt-{2 + len(list((job_dir / 'csv').glob('attempt-*')))}"
        return CSVLogger(save_dir=str(job_dir), name="csv", version=version)
    from scalelab.results.wandb_logger import TolerantWandbLogger

    job, config = cfg.job, logged_config(cfg)
    # group = the sweep, job_type = the strategy, tags and flat config keys to filter and chart by:
    # a W&B workspace groups and compares the runs with no editing.
    tags = [*cfg.logger.tags, cfg.strategy.name, *(f"{k}={config[k]}" for k in ("world_size", "global_batch_size",
                                                                                  "lr_rule") if k in config)]
    kw = dict(project=cfg.logger.project, entity=cfg.logger.entity, name=job.name, group=job.group,
              job_type=cfg.strategy.name, tags=list(dict.fromkeys(map(str, tags))), save_dir=str(job_dir),
              config=config, **_wandb_identity(job_dir, resumed))
    def make(mode):
        lg = TolerantWandbLogger(mode=mode, **kw)
        # Lightning always passes `anonymous` (None), and wandb 0.31 warns that it has no effect on every run.
        getattr(lg, "_wandb_init", {}).pop("anonymous", None)
        return lg

    logger = make(cfg.logger.mode)
    # Lightning's WandbLogger creates its run lazily and on global rank 0 only (rank_zero_experiment:
    # other ranks get a DummyExperiment), so a job is one W&B run. Online, rank 0 creates it here,
    # before training: no API key, no network (after WANDB_INIT_TIMEOUT, W&B's default 90 s) or any
    # init error then costs the live sync, never the run: it logs offline, and says how to sync.
    if cfg.logger.mode != "online" or _global_rank() != 0:
        return logger
    try:
        logger.experiment  # noqa: B018 - wandb.init
        return logger
    except Exception as exc:  # noqa: BLE001 - wandb raises UsageError, CommError, AuthenticationError, ...
        import wandb

        try:
            wandb.finish()
        except Exception:  # noqa: BLE001 - nothing was started
            pass
        why = (str(exc).strip().splitlines() or [""])[0][:200]
        print(f"[scalelab] warning: W&B online init failed ({type(exc).__name__}: {why}); logging offline "
              f"instead: sync later with `wandb sync {job_dir}/wandb/offline-run-*`", flush=True)
        # W&B's service keeps the failed run's id ("run ID ... is in use"): the offline run gets a
        # new one, saved in the job dir for this job's resumptions.
        kw.pop("resume", None)
        kw.update(_wandb_identity(job_dir, resumed=False))
        return make("offline")


WANDB_ID = ".wandb_run_id"  # JOB_DIR/.wandb_run_id: the job's W&B run, continued when the job resumes


def _wandb_identity(job_dir: Path, resumed: bool) -> dict:
    """A job resumed from its own checkpoint (requeued, restarted) continues its W&B run: the same
    id, resume="allow"; a fresh job gets a new id, saved for its resumptions. Only rank 0 creates
    the run (Lightning), so only rank 0 reads or writes the id."""
    if _global_rank() != 0:
        return {}
    path = job_dir / WANDB_ID
    if resumed and path.exists() and path.read_text().strip():
        return {"id": path.read_text().strip(), "resume": "allow"}
    import uuid

    run_id = uuid.uuid4().hex[:12]
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(run_id)
    return {"id": run_id}


def logged_config(cfg) -> dict:
    """The W&B config: the resolved config (nested; W&B shows it as dotted columns such as
    `optim.lr`) plus flat keys to group and chart by (world_size, global_batch_size, lr_rule, ...).
    No secret reaches it: keys that look like a token, secret or password are redacted (scrub), and
    so is the value of WANDB_API_KEY wherever it appears."""
    c = OmegaConf.to_container(cfg, resolve=True)
    job = c.pop("job", None) or {}
    trainer, data, optim = c.get("trainer") or {}, c.get("data") or {}, c.get("optim") or {}
    flat = {"global_batch_size": data.get("global_batch_size"), "lr_rule": lr_rule_label(c.get("lr_scaling") or {}),
            "base_lr": optim.get("lr"), "optimizer": optim.get("name"), "model_name": (c.get("model") or {}).get("name"),
            "precision": str(trainer.get("precision")), "sweep": job.get("group"),
            "num_nodes": trainer.get("num_nodes"), "devices_per_node": trainer.get("devices")}
    try:
        flat["world_size"] = int(trainer["devices"]) * int(trainer["num_nodes"])
    except (KeyError, TypeError, ValueError):
        pass
    # scrub also redacts the values of secret-named env variables (WANDB_API_KEY) inside strings
    return scrub({**c, **{k: v for k, v in flat.items() if v is not None and k not in c}})


def pins_batches(setting, accelerator: str) -> bool:
    """data.pin_memory: auto pins on GPU ranks (datamodule.py says why), true / false as given."""
    return accelerator == "gpu" if setting == "auto" else bool(setting)


def shutdown_process_group() -> None:
    """Fixes gloo ranks aborting at interpreter exit (`terminate called without an active
    exception`, SIGABRT in ProcessGroupGloo::runLoop; shared/notes/cpu-strategies.md section 1):
    with the model and optimizer already released, barrier then destroy the group, so no gloo
    thread is alive when the interpreter tears down. Must be the last collective of the rank."""
    gc.collect()
    if dist.is_available() and dist.is_initialized():
        dist.barrier()
        dist.destroy_process_group()


def run(job_dir: Path, marks: dict | None = None) -> int:
    marks = marks if marks is not None else {}
    cfg = OmegaConf.load(job_dir / "config_resolved.yaml")
    quiet_rank(_global_rank(), bool(cfg.get("verbose", False)))
    spec = validate(cfg)
    torch.set_num_threads(int(cfg.job.threads_per_rank))
    L.seed_everything(cfg.seed, workers=True, verbose=False)  # same initial weights on every rank
    rank, world = _global_rank(), spec.run.world_size
    if cfg.launcher.name == "torchrun" and spec.run.num_nodes > 1:  # nodes started by hand: the same command?
        from scalelab import same_job

        same_job.check(list(cfg.job.overrides), int(cfg.launcher.node_rank),
                       float(cfg.trainer.get("collective_timeout_s", 600)))
    plan = spec.plan
    with plan.init_device(spec.run, _local_rank()):  # on the GPU itself where it can
        module = LitModule(spec.run.model_arch, cfg.model.task, hydra.utils.instantiate(cfg.optim.optimizer),
                           spec.lr, cfg.trainer.max_steps, cfg.lr_scaling.warmup_steps, cfg.lr_scaling.decay,
                           cfg.lr_scaling.min_lr_ratio, plan, fused_on_gpu=bool(cfg.optim.get("fused_on_gpu", False)))
    marks["model_built"] = timing.now()
    n_params = num_params(module.net)
    data = ByteCorpusDataModule(cfg.job.data_prepared, spec.batch.global_batch_size,
                                spec.batch.per_device_batch_size, plan.dp_rank(rank, world),
                                spec.batch.dp_size, cfg.seed, cfg.data.num_workers,
                                pin_memory=pins_batches(cfg.data.get("pin_memory", "auto"), spec.run.accelerator))
    from scalelab.scaling.phase_memory import PhasePeaks

    # device memory by phase of the first steady step (CUDA ranks only: PhasePeaks checks the device)
    metrics = StepMetrics(spec.batch.accumulate_grad_batches, plan,
                          PhasePeaks(int(cfg.trainer.warmup_steps), spec.batch.accumulate_grad_batches))
    from scalelab.results.throughput_live import LiveThroughput
    from scalelab.scaling.metrics import HostLRMonitor

    seq = spec.seq_len if cfg.model.task == "lm" else None
    # LiveThroughput (Lightning's ThroughputMonitor without its per-step CUDA sync) logs a rolling
    # per-step view (rank 0) to the logger; the run record's steady-state figures come from StepMetrics.
    live = LiveThroughput(batch_size_fn=lambda b: b.shape[0], window_size=min(10, cfg.trainer.max_steps),
                          replicas=world // spec.batch.dp_size,   # tp x pp ranks share each sample
                          **({"length_fn": lambda b: b.shape[0] * seq} if seq else {}))
    # HostLRMonitor: Lightning's LearningRateMonitor without its per-step torch.tensor(lr, device=cuda)
    callbacks = [metrics, live] + ([HostLRMonitor("step")] if cfg.logger.name != "none" else [])
    if cfg.trainer.enable_progress_bar:
        callbacks.append(StepProgressBar(seq, spec.batch.global_batch_size))
    val_curve = ValidationCurve.for_config(cfg.trainer)  # None unless trainer.val_every_n_steps
    if val_curve is not None:
        callbacks.append(val_curve)
    resume, resumed_at = _resume_point(cfg, job_dir, rank)
    restart = int(os.environ.get("TORCHELASTIC_RESTART_COUNT") or 0)   # torchrun started this attempt again
    if restart and rank == 0:   # counted here: torchrun, not scalelab, restarts the ranks (spawn counts its own)
        # checkpoint.resume_from's step from its manifest or name (the worker learns it only once loaded)
        started = resumed_at if resumed_at is not None else checkpoint_step(resume) if resume else None
        note_restart(job_dir, restart, started)
        where = f"step {resumed_at}" if resumed_at is not None else \
            f"checkpoint.resume_from {resume}" if resume else "step 0"
        print(f"[scalelab] restart {restart} of {os.environ.get('TORCHELASTIC_MAX_RESTARTS', '?')}: every rank "
              f"started again and goes on from {where}", flush=True)
    periodic = periodic_checkpoint(job_dir, cfg.checkpoint.get("every_n_steps"), int(cfg.checkpoint.get("keep_last", 2)),
                                   note_progress=int(cfg.trainer.get("max_restarts", 0)) > 0)
    periodic.curve_of = metrics.curve_so_far                  # each checkpoint keeps the loss curve so far
    periodic.after_save = metrics.checkpoint_saved          # a save is in no step's time
    if resumed_at is not None:      # this job's own checkpoint (not resume_from: another run's curve)
        metrics.prior = read_curve(resume, rank) or metrics.prior  # ... which its record starts with
    window = _profile_window(cfg, spec, resumed=resume is not None)
    syncs = None
    if cfg.trainer.get("count_device_syncs", False):
        from scalelab.scaling.device_syncs import DeviceSyncCounter

        syncs = DeviceSyncCounter(int(cfg.trainer.warmup_steps) + 1,
                                  int(cfg.trainer.max_steps) - (window.steps if window is not None else 0))
        # before the window: at the first profiled batch the counter stops before the window's
        # own device synchronize (in its batch start), which is no step's sync
        callbacks.append(syncs)
    if window is not None:
        callbacks.append(window)
    # the savers after the window: a save at the window's last step comes once the window has closed
    callbacks.append(periodic)
    plugins, on_signal = [], None
    if os.environ.get(requeue.STEP_ENV) == "1":  # srun ranks of a SLURM batch job (scalelab.requeue)
        from lightning.pytorch.plugins.environments import SLURMEnvironment

        plugins = [SLURMEnvironment(auto_requeue=False)]  # requeueing is scalelab.requeue's, not Lightning's
        on_signal = requeue.requeue_callback(job_dir, periodic)
        callbacks.append(on_signal)
    logger = build_logger(cfg, job_dir, resumed=resume is not None)
    strategy = without_teardown_copies(plan.lightning_strategy(spec.run))
    if hasattr(strategy, "_timeout"):  # collectives fail after this instead of Lightning's 30 min
        strategy._timeout = timedelta(seconds=float(cfg.trainer.get("collective_timeout_s", 1800)))
    trainer = L.Trainer(
        accelerator=spec.run.accelerator, devices=spec.run.devices_per_node, num_nodes=spec.run.num_nodes,
        strategy=strategy, precision=cfg.trainer.precision,
        max_steps=cfg.trainer.max_steps, max_epochs=-1, accumulate_grad_batches=spec.batch.accumulate_grad_batches,
        gradient_clip_val=cfg.trainer.gradient_clip_val, logger=logger, callbacks=callbacks,
        log_every_n_steps=cfg.trainer.log_every_n_steps, enable_checkpointing=False,
        enable_model_summary=False, enable_progress_bar=bool(cfg.trainer.enable_progress_bar),
        use_distributed_sampler=False,  # GlobalBatchSampler shards by data-parallel rank itself
        num_sanity_val_steps=0, default_root_dir=str(job_dir), plugins=plugins,
        **validation_trainer_args(cfg.trainer, spec.batch.accumulate_grad_batches))
    requeue.rank_local_sigterm(trainer)   # no SIGTERM collective and device read per batch
    t0 = time.time()
    trainer.fit(module, datamodule=data, ckpt_path=str(resume) if resume else None)
    fit_s = time.time() - t0
    if on_signal is not None:
        requeue.ignore_late()
    if on_signal is not None and on_signal.stopped_at is not None:  # saved for the requeue: no record
        if logger and hasattr(logger, "finish") and rank == 0:
            logger.finish()  # the requeued job continues this W&B run (build_logger: resume by id)
        del trainer, module, data, metrics, callbacks, logger, on_signal
        shutdown_process_group()
        return 0
    if cfg.checkpoint.save:
        trainer.save_checkpoint(str(job_dir / "checkpoints" / "last.ckpt"), weights_only=False)
        if rank == 0:
            write_step(job_dir / "checkpoints" / "last.ckpt", trainer.global_step)
    if cfg.checkpoint.export_consolidated:
        state = plan.consolidated_state_dict(trainer, module)  # collective: all ranks call it
        if rank == 0:
            torch.save(state, job_dir / "model_consolidated.pt")
    summary = metrics.rank_summary()
    summary["strategy_metrics"] = plan.rank_metrics()  # e.g. a pipeline's per-stage step/compute times
    summary["breakdown"] = window.result if window is not None else None
    summary["device_syncs"] = syncs.result() if syncs is not None else None
    # which node each rank ran on (GROUP_RANK: torchrun's node; SLURM_NODEID under srun)
    summary["placement"] = {"rank": rank, "node_rank": int(os.environ.get("GROUP_RANK", os.environ.get(
        "SLURM_NODEID", 0))), "local_rank": _local_rank(), "hostname": os.uname().nodename}
    per_rank = gather_all(summary)
    real_world = dist.get_world_size() if dist.is_initialized() else 1
    if rank == 0:
        record = base_record(OmegaConf.to_container(cfg, resolve=True), spec.batch, spec.lr, real_world,
                             plan.parallel_degrees(world), spec.run.model_arch, n_params,
                             spec.run.accelerator, int(cfg.job.threads_per_rank))
        profiled = window.steps if window is not None and window.result else 0
        record.update(summarize(per_rank, spec.batch.global_batch_size, seq, cfg.trainer.warmup_steps,
                                plan.loss_ranks(world), profiled))
        record.update(plan.record_fields([r["strategy_metrics"] for r in per_rank], cfg.trainer.warmup_steps,
                                         profiled))
        record["memory"]["grads_freed_after_step"] = module.frees_grads_after_step
        record["breakdown"] = combine([r["breakdown"] for r in per_rank])
        record["placement"] = [r.get("placement") for r in per_rank]
        if any(r.get("device_syncs") for r in per_rank):
            record["device_syncs"] = [r.get("device_syncs") for r in per_rank]
        if resume and resumed_at is None:   # checkpoint.resume_from: where the loaded checkpoint left off
            resumed_at = int(trainer.global_step) - int(record["steps"])
        if record["short_run"]:
            st, since = record["step_time_s"], resumed_at or 0
            ran = f"steps {since + 1}-{cfg.trainer.max_steps} after the resume" if since else \
                f"max_steps {cfg.trainer.max_steps}"
            print(f"[scalelab] warning: only {st['measured_steps']} measured step(s) ({ran} - warm-up "
                  f"{st['warmup_steps_excluded']} - profiled {st['profiled_steps_excluded']}): step time and "
                  f"throughput are not steady-state; use trainer.max_steps >= "
                  f"{since + cfg.trainer.warmup_steps + profiled + MIN_MEASURED_STEPS}", flush=True)
        # the launcher's count (job.host_cores) where it gave one: MFU's peak where ranks share cores
        record["hardware"]["host_cores"] = int(cfg.job.get("host_cores") or host_cores())
        record["mfu"] = compute_mfu(record, spec.run.model_arch,
                                    load_profile(cfg.get("hardware_profile", "auto"), spec.run.accelerator,
                                                 cfg.get("cache_dir")))
        record["resumed_from"] = str(resume) if resume else None
        record["resumed_at_step"] = resumed_at
        if resumed_at:  # `steps` counts the whole run (as trainer.max_steps does); the figures above are this attempt's
            record["steps_this_attempt"] = record["steps"]
            record["steps"] = resumed_at + record["steps"]
        record["slurm"] = requeue.slurm_info()
        record["status"] = "completed"
        marks.update(first_step=metrics.first_step_at, last_step=metrics.last_step_at,
                     record_written=timing.now())
        record["timing"] = {"fit_s": fit_s, "marks": marks}  # the launcher adds its own and the phases
        if periodic.save_s:   # in no step's time: what checkpoint.every_n_steps cost on its own
            record["timing"]["checkpoint_saves_s"] = periodic.save_s
        # the LR the last step used (the optimizer's now is the scheduler's value after it)
        record["lr_final"] = (metrics.last_lr if metrics.last_lr is not None
                              else trainer.optimizers[0].param_groups[0]["lr"])
        record["val"] = val_curve.record() if val_curve is not None else None
        write_json(job_dir / RUN_FILE, record)
        _log_summary(logger, record)
    del trainer, module, data, metrics, callbacks, logger
    if os.environ.get("SCALELAB_UNSAFE_EXIT") != "1":  # diagnostic switch: see tests/integration/test_stability.py
        shutdown_process_group()
    return 0


def _resume_point(cfg, job_dir: Path, rank: int) -> tuple[str | None, int | None]:
    """(checkpoint to resume, its step; None for checkpoint.resume_from's: another run's). With
    checkpoint.resume=auto, this job's own newest valid periodic checkpoint (a restarted, requeued
    or re-run job goes on), saying which and why any newer one was passed over; before
    checkpoint.resume_from, where the job started (its own checkpoints are later: the Ctrl-C and
    restart lines promise them)."""
    start = str(cfg.checkpoint.resume_from) if cfg.checkpoint.resume_from else None
    if cfg.checkpoint.get("resume", "auto") != "auto":
        return start, None
    max_steps = cfg.trainer.max_steps
    slurm_job = os.environ.get("SLURM_JOB_ID") if requeue.requeue_count() > 0 else None  # a requeue: its own
    path, step, problems, passed_last = resume_point(job_dir, max_steps, slurm_job)
    if passed_last and path is None and rank == 0:
        print(f"[scalelab] the newest checkpoint is at trainer.max_steps={max_steps} and none before it"
              + (f" of SLURM job {slurm_job}" if slurm_job else "") + " (checkpoint.every_n_steps): "
              + ("starting from checkpoint.resume_from" if start else "starting over"), flush=True)
    if rank == 0:
        for p in problems:
            print(f"[scalelab] checkpoint {p}: not used", flush=True)
        if path is not None:
            print(f"[scalelab] resuming from {path} (step {step}" + ("; this job's own, after "
                  "checkpoint.resume_from" if start else "") + ")", flush=True)
            (job_dir / RESUMED).write_text(str(step))
    return (str(path), step) if path is not None else (start, None)


def _profile_window(cfg, spec, resumed: bool = False) -> ProfileWindow | None:
    """The last trainer.profile_steps steps of this run, if enough steady steps remain outside it.
    Not for resumed runs (their step count is known only after the checkpoint loads)."""
    steps = int(cfg.trainer.get("profile_steps", 0) or 0)
    # profiled steps are not measured ones: keep MIN_MEASURED_STEPS outside the window (with 3,
    # max_steps 11-12 profiled and left 3-4 steps, a short run, where 10 left 5 and no profile)
    if steps <= 0 or resumed or cfg.trainer.max_steps - cfg.trainer.warmup_steps < steps + MIN_MEASURED_STEPS:
        return None
    return ProfileWindow(cfg.trainer.max_steps - steps, steps, spec.batch.accumulate_grad_batches)


def _log_summary(logger, record: dict) -> None:
    if not logger:
        return
    summary = {"throughput/samples_per_s": record["throughput"]["samples_per_s"],
               "step_time/median_s": record["step_time_s"]["median"],
               "step_time/p90_s": record["step_time_s"]["p90"],
               "memory/peak_rss_bytes_max": max(record["memory"]["peak_rss_bytes_per_rank"]),
               "memory/model_state_bytes_max": max(record["memory"]["model_state_bytes_per_rank"]),
               "loss/final": record["loss"]["final"], "lr/used": record["lr"]}
    if record.get("mfu"):
        summary["mfu"] = record["mfu"]["value"]
    if record.get("breakdown"):
        b = record["breakdown"]
        summary.update({"breakdown/comm_fraction": b["comm_fraction"], "breakdown/wait_fraction": b["wait_fraction"],
                        "breakdown/compute_imbalance": b["compute_imbalance"]})
        for i, r in enumerate(b["per_rank"]):
            summary.update({f"breakdown/rank{i}/{k}": r[k] for k in ("compute_s", "transfer_s", "wait_s")})
    if record["throughput"]["tokens_per_s"]:
        summary["throughput/tokens_per_s"] = record["throughput"]["tokens_per_s"]
    logger.log_metrics(summary, step=record["steps"])
    if hasattr(logger, "finish"):  # TolerantWandbLogger
        logger.finish(summary)     # one W&B run per job, closed by the job
    else:
        logger.save()


def main() -> int:
    """A rank started as a fresh interpreter (torchrun, srun)."""
    job_dir = Path(sys.argv[1])
    marks = {"rank_process_start": timing.process_start_time(), "imports_done": timing.now()}
    # an earlier attempt's (a torchrun restart), which would be read as this attempt's error
    (job_dir / f"error-rank{_global_rank()}.txt").unlink(missing_ok=True)
    try:
        return run(job_dir, marks)
    except BaseException as exc:
        (job_dir / f"error-rank{_global_rank()}.txt").write_text(traceback.format_exc())
        requeue.end_by_sigterm(exc)
        raise


def rank_entry(job_dir: Path) -> int:
    """A rank forked from the launcher's pre-imported server (scalelab.spawn): no imports to pay.
    Returns the exit code; a failure is written to error-rank<R>.txt, as in main()."""
    now = timing.now()
    (job_dir / f"error-rank{_global_rank()}.txt").unlink(missing_ok=True)   # an earlier attempt's (a restart)
    try:
        return run(job_dir, {"rank_process_start": now, "imports_done": now})
    except BaseException as exc:
        (job_dir / f"error-rank{_global_rank()}.txt").write_text(traceback.format_exc())
        traceback.print_exc()
        requeue.end_by_sigterm(exc)
        return 1


if __name__ == "__main__":
    sys.exit(main())

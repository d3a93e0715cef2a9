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
                                    write_curve, write_step)
from scalelab.config import validate, warmup_when_longer
from scalelab.console import StepProgressBar, quiet_rank
from scalelab.data.datamodule import ByteCorpusDataModule, ValidationCurve, validation_trainer_args
from scalelab.launch import host_cores, too_few_gpus
from scalelab.models.gpt import num_params
from scalelab.models.lit import LitModule, RankRandomness, optimizer_settings
from scalelab.strategies.base import without_teardown_copies
from scalelab.strategies.group_timeout import with_collective_timeout
from scalelab.results.record import RUN_FILE, base_record, write_json
from scalelab.results.run_logger import build_logger, global_rank, log_summary
from scalelab.scaling.breakdown import ProfileWindow, combine
from scalelab.scaling.mfu import compute_mfu, load_profile, no_profile_note
from scalelab.scaling.metrics import StepMetrics, gather_all
from scalelab.scaling.run_summary import MIN_MEASURED_STEPS, summarize


def _local_rank() -> int:
    return int(os.environ.get("LOCAL_RANK", os.environ.get("SLURM_LOCALID", 0)))


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
    quiet_rank(global_rank(), bool(cfg.get("verbose", False)))
    spec = validate(cfg)   # on the job's accelerator as launched (job.accelerator), not `auto` again
    if spec.run.accelerator == "gpu" and (few := too_few_gpus(torch.cuda.device_count(), spec.run.devices_per_node,
                                                               cfg.launcher.name)):
        raise RuntimeError(few)   # not Lightning's "invalid device ordinal" after the queue wait
    torch.set_num_threads(int(cfg.job.threads_per_rank))
    L.seed_everything(cfg.seed, workers=True, verbose=False)  # same initial weights on every rank
    rank, world = global_rank(), spec.run.world_size
    resume, resumed_at = _resume_point(cfg, job_dir, rank)
    timeout_s = float(cfg.trainer.get("collective_timeout_s", 600))   # conf/trainer/default.yaml's
    run_config = OmegaConf.to_container(cfg, resolve=True)   # the nodes compare it; each checkpoint holds it
    if cfg.launcher.name == "torchrun" and spec.run.num_nodes > 1:  # nodes started by hand: the same command?
        from scalelab import same_job
        from scalelab.data.prepare import data_identity

        # ... and global rank 0's checkpoint to go on from, for every node (each has its own folder), and
        # the same accelerator on every node (each node's launcher resolved trainer.accelerator=auto itself)
        resume, resumed_at = same_job.check(list(cfg.job.overrides), int(cfg.launcher.node_rank),
                                            timeout_s, resume=(resume, resumed_at), accelerator=spec.run.accelerator,
                                            data=data_identity(cfg.job.data_prepared),
                                            config=run_config)
    plan = spec.plan
    inexact = plan.resume_note(spec.run.world_size) if resume else None
    if inexact and rank == 0:
        print(f"[scalelab] warning: this resume is not exact: {inexact}", flush=True)
    with plan.init_device(spec.run, _local_rank()):  # on the GPU itself where it can
        module = LitModule(spec.run.model_arch, cfg.model.task, hydra.utils.instantiate(cfg.optim.optimizer),
                           spec.lr, cfg.trainer.max_steps, cfg.lr_scaling.warmup_steps, cfg.lr_scaling.decay,
                           cfg.lr_scaling.min_lr_ratio, plan, fused_on_gpu=bool(cfg.optim.get("fused_on_gpu", False)))
    module.run_config = run_config   # in each checkpoint (a copy is checked by it)
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
    # Its window is at least 2 (Lightning asserts it): trainer.max_steps=1 failed every rank.
    live = LiveThroughput(batch_size_fn=lambda b: b.shape[0], window_size=max(2, min(10, cfg.trainer.max_steps)),
                          replicas=world // spec.batch.dp_size,   # tp x pp ranks share each sample
                          **({"length_fn": lambda b: b.shape[0] * seq} if seq else {}))
    # HostLRMonitor: Lightning's LearningRateMonitor without its per-step torch.tensor(lr, device=cuda).
    # Both only feed a logger: under logger=none they are left out (LiveThroughput's update was
    # 0.56 ms of every step on every rank, measured in the step time, for nothing)
    logged = cfg.logger.name != "none"
    callbacks = [metrics, *([live] if logged else []), RankRandomness(cfg.seed)]
    if logged:
        callbacks.append(HostLRMonitor("step"))
    if cfg.trainer.enable_progress_bar:
        callbacks.append(StepProgressBar(seq, spec.batch.global_batch_size))
    val_curve = ValidationCurve.for_config(cfg.trainer)  # None unless trainer.val_every_n_steps
    if val_curve is not None:
        callbacks.append(val_curve)
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
        # ... which its record starts with; a node's ranks keep theirs in their own node's folder
        metrics.prior = (read_curve(resume, rank) or read_curve(job_dir / "checkpoints" / Path(resume).name, rank)
                         or metrics.prior)
    elif resume and Path(resume).resolve().parent == (job_dir / "checkpoints").resolve():
        metrics.prior = read_curve(resume, rank) or metrics.prior   # resume_from this job's own last.ckpt
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
    elif requeue.saves_on_sigterm(cfg):   # elsewhere (local, torchrun, a pod): SIGTERM saves at an agreed step
        on_signal = requeue.requeue_callback(job_dir, periodic, slurm=False)
        callbacks.append(on_signal)
    # before any gloo group: not the loopback one on several nodes; each node's first rank says which
    # interface it had to guess (on stderr but on rank 0: quiet_rank leaves stdout to rank 0)
    if (chose := requeue.gloo_interface(spec.run.num_nodes)) and _local_rank() == 0:
        print(chose, file=sys.stdout if rank == 0 else sys.stderr, flush=True)
    logger = build_logger(cfg, job_dir, resumed=resume is not None)
    # collectives fail after trainer.collective_timeout_s (Lightning's default: 30 min), on the default
    # group and on the strategies' sub-groups (strategies/group_timeout.py)
    strategy = with_collective_timeout(without_teardown_copies(plan.lightning_strategy(spec.run)), timeout_s)
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
    if on_signal is not None and on_signal.slurm:
        requeue.ignore_late()
    if on_signal is not None and on_signal.stopped_at is not None:  # saved for the requeue: no record
        if logger and hasattr(logger, "finish") and rank == 0:
            logger.finish()  # the requeued job continues this W&B run (build_logger: resume by id)
        slurm = on_signal.slurm
        del trainer, module, data, metrics, callbacks, logger, on_signal
        shutdown_process_group()
        # outside SLURM: interrupted and resumable (the launcher, torchrun or a pod's restart policy
        # must not take it for a completed run; an elastic restart resumes from the save)
        return 0 if slurm else requeue.STOPPED_EXIT
    if cfg.checkpoint.save:
        last = job_dir / "checkpoints" / "last.ckpt"
        trainer.save_checkpoint(str(last), weights_only=False)
        if rank == 0:
            write_step(last, trainer.global_step)
        # its loss curve, as beside a periodic save: the run continued from it (resume_from, as the
        # longer-run refusal says) kept a record whose curve and loss.first began after it
        write_curve(last, rank, metrics.curve_so_far())
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
            # a longer run goes on from this job's newest checkpoint, not from this attempt's start
            # (the hint counted from `since`: 25 after a resume at 15, then 30 after one at 20, ...)
            every = int(cfg.checkpoint.get("every_n_steps") or 0)
            goes_on = max(since, cfg.trainer.max_steps // every * every) if every else since
            print(f"[scalelab] warning: only {st['measured_steps']} measured step(s) ({ran} - warm-up "
                  f"{st['warmup_steps_excluded']} - profiled {st['profiled_steps_excluded']}): step time and "
                  f"throughput are not steady-state; use trainer.max_steps >= "
                  f"{goes_on + warmup_when_longer(cfg) + profiled + MIN_MEASURED_STEPS}"
                  + (f" (a longer run resumes from step {goes_on})" if goes_on else ""), flush=True)
        # the launcher's count (job.host_cores) where it gave one: MFU's peak where ranks share cores
        record["hardware"]["host_cores"] = int(cfg.job.get("host_cores") or host_cores())
        record["mfu"] = compute_mfu(record, spec.run.model_arch,
                                    load_profile(cfg.get("hardware_profile", "auto"), spec.run.accelerator,
                                                 cfg.get("cache_dir")))
        if record["mfu"] is None and (note := no_profile_note(cfg.get("hardware_profile", "auto"), spec.run.accelerator)):
            print(note, flush=True)
        record["resumed_from"] = str(resume) if resume else None
        record["resumed_at_step"] = resumed_at
        record["resume_inexact"] = inexact
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
        # what the optimizer trained with (after a resume too: LitModule._own_optimizer_settings)
        record["optimizer_settings"] = optimizer_settings(trainer.optimizers[0].param_groups[0])
        write_json(job_dir / RUN_FILE, record)
        log_summary(logger, record)
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

    def from_start() -> tuple[str | None, None]:
        if start and rank == 0:   # said as a job's own resume is (it went unsaid: only run.json told)
            step = checkpoint_step(Path(start))
            print(f"[scalelab] resuming from {start} (" + (f"step {step}; " if step is not None else "")
                  + "checkpoint.resume_from)", flush=True)
        return start, None

    if cfg.checkpoint.get("resume", "auto") != "auto":
        return from_start()
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
    return (str(path), step) if path is not None else from_start()


def _profile_window(cfg, spec, resumed: bool = False) -> ProfileWindow | None:
    """The last trainer.profile_steps steps of this run, if enough steady steps remain outside it.
    Not for resumed runs (their step count is known only after the checkpoint loads)."""
    steps = int(cfg.trainer.get("profile_steps", 0) or 0)
    # profiled steps are not measured ones: keep MIN_MEASURED_STEPS outside the window (with 3,
    # max_steps 11-12 profiled and left 3-4 steps, a short run, where 10 left 5 and no profile)
    if steps <= 0 or resumed or cfg.trainer.max_steps - cfg.trainer.warmup_steps < steps + MIN_MEASURED_STEPS:
        return None
    return ProfileWindow(cfg.trainer.max_steps - steps, steps, spec.batch.accumulate_grad_batches)


def main() -> int:
    """A rank started as a fresh interpreter (torchrun, srun)."""
    job_dir = Path(sys.argv[1])
    marks = {"rank_process_start": timing.process_start_time(), "imports_done": timing.now()}
    # an earlier attempt's (a torchrun restart), which would be read as this attempt's error
    (job_dir / f"error-rank{global_rank()}.txt").unlink(missing_ok=True)
    try:
        return run(job_dir, marks)
    except BaseException as exc:
        (job_dir / f"error-rank{global_rank()}.txt").write_text(traceback.format_exc())
        _close_wandb_as_failed(exc)
        requeue.end_by_sigterm(exc)
        raise


def _close_wandb_as_failed(exc: BaseException) -> None:
    """Rank 0's W&B run ends failed with what it logged so far; not on SIGTERM (a preemption: the
    requeued attempt resumes the run, and its service is gone with the signal anyway)."""
    from lightning.pytorch.utilities.exceptions import SIGTERMException

    from scalelab.results.wandb_logger import finish_failed_run

    if not isinstance(exc, SIGTERMException):
        finish_failed_run()


def rank_entry(job_dir: Path) -> int:
    """A rank forked from the launcher's pre-imported server (scalelab.spawn): no imports to pay.
    Returns the exit code; a failure is written to error-rank<R>.txt, as in main()."""
    now = timing.now()
    (job_dir / f"error-rank{global_rank()}.txt").unlink(missing_ok=True)   # an earlier attempt's (a restart)
    try:
        return run(job_dir, {"rank_process_start": now, "imports_done": now})
    except BaseException as exc:
        (job_dir / f"error-rank{global_rank()}.txt").write_text(traceback.format_exc())
        traceback.print_exc()
        _close_wandb_as_failed(exc)
        requeue.end_by_sigterm(exc)
        return 1


if __name__ == "__main__":
    code = main()   # an exception leaves as before: its traceback, exit 1 (torchrun's summary, srun's)
    # done: no interpreter teardown of torch and Lightning (2.6-5.6 s a job under torchrun_local after
    # its record; a forked rank ends so too, multiprocessing's os._exit); W&B and the process group
    # are finished by then (run)
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)

"""`scalelab-train`: the Hydra app. Compose -> validate -> save resolved config -> launch ranks
-> collect the run record (and its end lines: scalelab.run_end). Every job of a multirun is
validated before the first one starts (scalelab.preflight).
"""
from __future__ import annotations

import json
import logging
import math
import os
import re
import sys
from pathlib import Path

import hydra
from hydra.core.hydra_config import HydraConfig
from hydra.types import RunMode
from omegaconf import DictConfig, OmegaConf

from scalelab import job_dir as job_dir_check
from scalelab import launch, requeue, run_end, same_job, spawn, timing
from scalelab.checkpointing import (PROGRESS, RESTARTS, RESUMED, goes_on_from, read_restarts,
                                    set_aside_damaged)
from scalelab.errors import ConfigError
from scalelab.job_outcome import (RERUN_MARK, collect, failed_on_node, mark_attempt, node_record, one_line,
                                  stopped_record)
from scalelab.paths import conf_dir
from scalelab.results.record import (RUN_FILE, BadRecord, install_log_redaction, load_record,
                                     redact_text, register_override_secrets, scrub, scrub_file, write_json)
from scalelab.run_end import job_timeout, results_line, timed_out
from scalelab.slurm_request import srun_cpus_per_task, srun_crowded

# Light imports only at the top: main() starts the ranks' fork server before anything imports
# torch (scalelab.config, preflight), so the server's imports overlap the launcher's own.

log = logging.getLogger("scalelab")
# The command's failed jobs. Kept in scalelab.launch: under `python -m scalelab.train` this module
# is __main__, and the SLURM launcher plugin (which imports scalelab.*) must add to the same list.
_FAILED: list[str] = launch.FAILED_JOBS
_MARKS: dict = {}  # this command's own marks (launcher_start, preflight_done)
# Set by scalelab.slurm for a job of a sweep or array that runs as its own SLURM job (Hydra run mode)
SWEEP_ENV, NUM_ENV = "SCALELAB_SWEEP_DIR", "SCALELAB_JOB_NUM"
# Hydra's flags that print something and run no job: no ranks' fork server for them
_NO_JOB = {"--help", "-h", "--hydra-help", "--cfg", "-c", "--info", "-i", "--version", "--shell-completion", "-sc"}


def run_job(cfg: DictConfig) -> dict:
    from scalelab.config import smoke_warmup, validate, warmup_given
    from scalelab.plan.hardware import HOST_CPU, host_cpu_profile
    from scalelab.results.table import print_table
    from scalelab.scaling.mfu import profile_name

    job_start = timing.now()
    hc = HydraConfig.get()
    job_dir = Path(hc.runtime.output_dir).resolve()
    multirun = hc.mode == RunMode.MULTIRUN
    _MARKS["job_dir"] = job_dir   # the job a Ctrl-C interrupts (main: _interrupted)
    _MARKS["job_start"] = job_start
    _MARKS["run_dir"] = job_dir   # the folder the same command goes on in (node K's files: JOB_DIR/nodeK)
    _MARKS["max_steps"] = int(cfg.trainer.max_steps)
    _MARKS["every_n_steps"] = cfg.checkpoint.get("every_n_steps")
    _MARKS["sweep_dir"] = Path(hc.sweep.dir).resolve() if multirun else None
    # Hydra saved the composed config and the overrides (.hydra/, the sweep's multirun.yaml) as
    # given: redact secrets there before anything else (results.record.scrub_file).
    for saved in [*job_dir.glob(".hydra/*.yaml"), *([Path(hc.sweep.dir) / "multirun.yaml"] if multirun else [])]:
        scrub_file(saved)
    smoke = smoke_warmup(cfg, warmup_given(hc.overrides.task))   # trainer.max_steps=3 under the default warm-up
    if smoke:
        log.warning(smoke)
    spec = validate(cfg)  # cheap; preflight already checked, this guards programmatic use
    from scalelab.data.prepare import prepare_for_run

    # under srun the ranks run on the allocation's nodes, with its CPUs per task, not on this host
    per_task = srun_cpus_per_task(spec.run.devices_per_node) if cfg.launcher.name == "srun" else None
    cores = launch.host_cores() if per_task is None else per_task * spec.run.devices_per_node   # the node's
    threads = launch.threads_per_rank(cfg.trainer.threads_per_rank, spec.run.devices_per_node, spec.run.accelerator,
                                      cores)
    crowded = (launch.oversubscribed(spec.run.devices_per_node, threads, spec.run.accelerator) if per_task is None
               else srun_crowded(spec.run.devices_per_node, threads, per_task, spec.run.accelerator))
    if crowded:
        log.warning(crowded)
    cache = Path(cfg.cache_dir)
    if profile_name(cfg.get("hardware_profile", "auto"), spec.run.accelerator) == HOST_CPU:
        host_cpu_profile(cache)  # MFU's peak: probe this host once (cached), while no rank runs
    sweep_dir, num = _sweep_and_num(hc, multirun)
    group = job_group(cfg.launcher.name, job_dir, sweep_dir)
    resolved = OmegaConf.to_container(cfg, resolve=True)
    resolved["job"] = {
        "name": f"{group}/{num}" if sweep_dir else group, "group": group, "dir": str(job_dir),
        "sweep_dir": str(sweep_dir) if sweep_dir else None,
        "num": num, "overrides": list(hc.overrides.task),
        "threads_per_rank": threads,
        "accelerator": spec.run.accelerator,   # as resolved here, for every rank (config._as_launched)
        # this node's cores as the launcher sees them (its affinity: the job's allocation); under
        # srun, a node's ranks x the allocation's CPUs per task (this process may run elsewhere)
        "host_cores": cores,
        "data_prepared": str(prepare_for_run(resolved, spec)),  # preflight prepared it: a cache hit
    }
    layout = None
    if cfg.launcher.name == "torchrun":  # this node of a multi-node job: resolved here, read by the ranks
        layout = launch.torchrun_layout(cfg.launcher, spec.run.num_nodes)
        layout["rdzv_id"] = layout["rdzv_id"] or same_job.rdzv_id(layout["endpoint"], resolved["job"]["num"])
        resolved["launcher"].update(rdzv_endpoint=layout["endpoint"], node_rank=layout["node_rank"],
                                    rdzv_id=layout["rdzv_id"])
        job_dir = node_folder(job_dir, layout["node_rank"])   # nodes that share the job's folder
        if layout["node_rank"]:   # node 0 summarizes the sweep: its jobs failed, kept or ran here alike
            from scalelab.results.callbacks import OTHER_NODE

            OTHER_NODE.append(layout["node_rank"])
        resolved["job"]["dir"] = str(job_dir)
        _MARKS["job_dir"] = job_dir
    refused = job_dir_check.refusal(job_dir, resolved)  # preflight checks the folders it can name
    if refused:   # another job's run: the job writes nothing there (Hydra has written .hydra/ and train.log)
        job_dir_check.REFUSED.append(str(job_dir))
        _FAILED.append(f"{resolved['job']['name']}: {refused}")
        log.error(f"[scalelab] job {resolved['job']['name']} FAILED: {refused}")
        return {"status": "failed", "error": refused, "job": resolved["job"]}
    try:
        done = load_record(job_dir / RUN_FILE)
    except BadRecord:                        # none yet (or unusable): nothing to keep
        done = None
    if requeue.completed_earlier(done, resolved["job"]["overrides"]):  # requeued after it finished: keep it
        mark_attempt(job_dir, f": the run completed in requeue {done['slurm'].get('requeues', 0)}; its record is kept")
        log.info(f"[scalelab] {resolved['job']['name']}: completed in an earlier attempt of SLURM job "
                 f"{done['slurm']['job_id']} (requeue {done['slurm'].get('requeues', 0)}); record kept, nothing to run")
        return done
    # a completed run kept: also one that started from checkpoint.resume_from, when it is the same
    # checkpoint (the same command again retrained it and replaced its record)
    started_from = (((done or {}).get("config") or {}).get("checkpoint") or {}).get("resume_from")
    same_start = not cfg.checkpoint.resume_from or started_from == cfg.checkpoint.resume_from
    if (cfg.checkpoint.get("resume", "auto") == "auto" and same_start
            and job_dir_check.completed_here(done, resolved)):
        # the same command run again into this folder (a sweep rerun after a crash or Ctrl-C)
        log.info(f"[scalelab] {resolved['job']['name']}: completed earlier in {job_dir}; record kept, nothing to "
                 "run (checkpoint.resume=never runs it again)")
        print_table([done], log) if not multirun else log.info(one_line(done))
        if not multirun:
            log.info(results_line(job_dir))
        return done
    OmegaConf.save(OmegaConf.create(scrub(resolved)), job_dir / job_dir_check.CONFIG_FILE)
    if job_dir_check.completed_run(done):
        # a completed run this one replaces (trained longer, or checkpoint.resume=never): its record is
        # kept beside, as run.completed-STEPS.json (compare reads run.json only). It was deleted here,
        # and a continuation that then failed left no completed figures at all (found by review).
        aside = job_dir / f"run.completed-{done.get('steps')}.json"
        (job_dir / RUN_FILE).replace(aside)
        log.info(f"[scalelab] the completed record of {done.get('steps')} steps this run replaces is kept as {aside}")
    (job_dir / RUN_FILE).unlink(missing_ok=True)
    # a failed record's steps and resume point come from this run's marks only; an earlier run's
    # restarts (torchrun) are not this run's
    for mark in (PROGRESS, RESUMED, RESTARTS, requeue.PREEMPTED):
        (job_dir / mark).unlink(missing_ok=True)
    for stale in job_dir.glob("error-rank*.txt"):  # an earlier run's here: not this run's error
        stale.unlink(missing_ok=True)
    if cfg.checkpoint.get("resume", "auto") == "auto":   # once here, not in every rank: the ranks agree
        slurm_job = os.environ.get("SLURM_JOB_ID") if requeue.requeue_count() > 0 else None  # as the ranks
        try:
            for line in set_aside_damaged(job_dir, int(cfg.trainer.max_steps), slurm_job):
                log.info(f"[scalelab] {line}")
        except ConfigError as e:   # one it cannot set aside (every rank would crash loading it): this job's record
            record = {**collect(job_dir, 1, resolved, spec, threads), "error": str(e)}
            write_json(job_dir / RUN_FILE, scrub(record))
            report_end(record, resolved["job"]["name"], job_dir, multirun)
            return record
    slurm_batch = cfg.launcher.name == "srun" and requeue.in_slurm_job()   # ranks.log marks its attempts
    if (job_dir / "ranks.log").exists() and not slurm_batch:                # ranks.log keeps every run
        with open(job_dir / "ranks.log", "a") as f:
            f.write(f"{RERUN_MARK} {timing.now():.0f}\n")
    micro, acc = spec.batch.per_device_batch_size, spec.batch.accumulate_grad_batches
    chunks = int(getattr(spec.plan, "microbatches", None) or 1)
    # a pipeline cuts each replica's batch into its schedule's micro-batches: as the table's "4x4 pp"
    split = f"micro {micro // chunks} x {acc * chunks} pp" if chunks > 1 and micro % chunks == 0 else \
        f"micro {micro} x acc {acc}"
    log.info(f"[scalelab] {resolved['job']['name']}: strategy={cfg.strategy.name} world={spec.run.world_size} "
             f"batch={spec.batch.global_batch_size} ({split}) -> {job_dir}")
    cmd = launch.rank_command(cfg.launcher.name, spec.run.num_nodes, spec.run.devices_per_node, job_dir,
                              list(cfg.launcher.get("extra_args") or []),
                              int(cfg.trainer.get("max_restarts", 0)), layout)  # torchrun / srun
    env = launch.rank_env(cache, threads, job_dir, bool(cfg.get("verbose", False)), cfg.launcher.name,
                          int(cfg.trainer.get("max_restarts", 0)))
    signals = None
    if slurm_batch:  # a batch job: rank layout and requeue
        env.update(requeue.master_env())
        if os.environ.get("SLURM_CPUS_PER_TASK"):  # srun (22.05+) no longer takes it from the job
            cmd.insert(1, f"--cpus-per-task={os.environ['SLURM_CPUS_PER_TASK']}")
        signals = requeue.BatchSignals(job_dir)
        mark_attempt(job_dir)
    from scalelab.results.run_logger import wandb_folders

    earlier_wandb = wandb_folders(job_dir)   # W&B runs of earlier attempts: not this attempt's failure
    spawned = timing.now()
    _MARKS["stop_record"] = (job_dir, resolved, spec, threads, layout)   # what a Ctrl-C writes (_stop)
    if cfg.launcher.name == "local":   # forks of a pre-imported server (scalelab.spawn)
        auto, start = cfg.checkpoint.get("resume", "auto") == "auto", cfg.checkpoint.resume_from
        rc, elastic = spawn.run_job(job_dir, spec.run.devices_per_node, env, job_dir / "ranks.log",
                                    job_timeout(cfg), int(cfg.trainer.get("max_restarts", 0)),
                                    lambda: goes_on_from(job_dir, cfg.trainer.max_steps, auto, start),
                                    tracebacks=bool(cfg.get("verbose", False)))
    elif signals is not None:
        with signals:   # the job's .out as a console: each exception line, not 100+ lines per rank (ranks.log has them)
            rc, elastic = launch.run_ranks(cmd, env, job_dir / "ranks.log", job_timeout(cfg),
                                           on_start=lambda p: setattr(signals, "proc", p),
                                           console=None if cfg.get("verbose", False) else launch.TracebackFilter()), {}
        # rc 124: trainer.timeout_s ended the ranks (they may have saved on its SIGTERM): a failed
        # job, not SLURM's preemption, which requeues or ends the job itself
        stopped = None if rc == 124 else requeue.after_ranks(job_dir, signals.got,
                                                             finished=rc == 0 and (job_dir / RUN_FILE).exists())
        if stopped:  # saved for a requeue: the next attempt writes the run record
            log.info(f"[scalelab] {resolved['job']['name']}: {stopped}")
            if stopped.startswith("SIGTERM"):
                # SLURM ends (scancel, the time limit) or requeues the job itself: a record of how far
                # it got, which a requeued attempt replaces (scalelab slurm's finalize adds the state)
                write_json(job_dir / RUN_FILE, scrub(stopped_record(job_dir, resolved, spec, threads, stopped, 143)))
            return {"status": "requeued", "job": resolved["job"]}
    else:  # torchrun (one node of several, or torchrun_local): its tracebacks stay in ranks.log
        console = launch.TracebackFilter() if not cfg.get("verbose", False) else None
        start_by = None
        if layout is not None:
            # a rendezvous that never completes (torchrun's store client can wait forever on an endpoint
            # where another program listens; with no node 0 it retries past its timeout) ends here
            # (the margin covers torchrun's own start, which a loaded host or a cold file system slows)
            margin = max(30.0, 0.1 * float(layout["timeout_s"]))
            start_by = (float(layout["timeout_s"]) + margin, f"no rank started within launcher.rdzv_timeout_s="
                        f"{layout['timeout_s']:g} + {margin:g} s: is {layout['endpoint']} node 0's scalelab-train "
                        "(or another program's port)?")
        rc = launch.run_ranks(cmd, env, job_dir / "ranks.log", job_timeout(cfg), console=console,
                              start_by=start_by)
        # torchrun restarts the ranks itself (--max-restarts): a restarted global rank 0 counted them
        # (launcher=torchrun: in the job folder of the node that ran it)
        elastic = read_restarts(job_dir) if layout is None or (job_dir / RESTARTS).exists() else {}
        if layout is not None and rc not in (0, 124) and requeue.stopped_at(job_dir) is not None:
            # another node got the SIGTERM (a pod's eviction, a spot preemption): every rank saved at
            # one step and exited 143, which torchrun reports as a failure. Stopped like that node,
            # not failed: no failed record, exit 143 (retryable for a pod's restart policy, where 1 is not)
            raise _Terminated("SIGTERM on another node")
    exited = timing.now()
    if layout is not None and rc == 0 and not (job_dir / RUN_FILE).exists():
        record = node_record(resolved, spec, threads, layout)  # global rank 0 ran on another node
    else:
        record = collect(job_dir, rc, resolved, spec, threads, since=spawned)
        if rc == 124 and math.isfinite(job_timeout(cfg)):   # the launcher ended it at trainer.timeout_s
            record["error"] = timed_out(cfg)
        if layout is not None and rc != 0:   # one node of a multi-node job (launcher=torchrun) failed
            failed_on_node(record, job_dir, layout)
        if record["status"] == "failed":   # rank 0's W&B run: closed as finished before the failure, or never
            from scalelab.results.run_logger import mark_failed

            mark_failed(job_dir, resolved.get("logger") or {}, redact_text(record["error"]), cache,
                        earlier=earlier_wandb)
    record.update(elastic)                   # restarts and steps redone (launcher=local, torchrun)
    from scalelab.data.prepare import run_data

    record["data"] = run_data(resolved["job"]["data_prepared"], resolved["data"])   # what it trained on
    t = record.setdefault("timing", {})
    # The whole command's start for the first job of a command; later jobs of a sweep start at
    # their own job_start (the launcher's start-up is paid once per sweep).
    first = not _MARKS.get("job_seen")
    _MARKS["job_seen"] = True
    marks = {**({k: _MARKS[k] for k in ("launcher_start", "preflight_done") if _MARKS.get(k)} if first else {}),
             "job_start": job_start, "ranks_spawned": spawned, **(t.get("marks") or {}), "ranks_exited": exited}
    origin = "launcher_start" if "launcher_start" in marks else "job_start"
    t.update(job_s=exited - spawned, marks=marks, origin=origin, phases_s=timing.phases(marks, origin))
    if marks.get("first_step") and marks.get("last_step"):
        # what the job cost besides its steady training: start-up before the first step + shutdown
        t["fixed_s"] = round((marks["first_step"] - marks[origin]) + (exited - marks["last_step"]), 4)
    write_json(job_dir / RUN_FILE, scrub(record))  # the error text of a failed job may quote a secret
    report_end(record, resolved["job"]["name"], job_dir, multirun)
    return record


def report_end(record: dict, name: str, job_dir: Path, multirun: bool) -> None:
    """run_end.report_end: the job's end lines; a failed job added to this command's _FAILED."""
    launch.end_open_line()
    run_end.report_end(record, name, job_dir, multirun, _FAILED)


def job_group(launcher: str, job_dir: Path, sweep_dir: Path | None) -> str:
    """The job's group (its W&B group; a sweep's job is GROUP/NUM): the sweep folder's name, else the
    job folder's; a node's own folder of a multi-node job (scalelab k8s --pvc: NAME/node${RANK}, a
    run's or a sweep's) stands for NAME: every k8s job's and sweep's runs were named and grouped
    "node0", all k8s sweeps of a project in one group."""
    def named(d: Path) -> Path:
        return d.parent if launcher == "torchrun" and re.fullmatch(r"node\d+", d.name) else d

    return named(sweep_dir).name if sweep_dir else named(job_dir).name


def node_folder(job_dir: Path, node_rank: int) -> Path:
    """launcher=torchrun: the folder of this node's own files (its resolved config, which its ranks
    read, run.json, ranks.log, marks). Node 0: the job's folder. Node K > 0: JOB_DIR/nodeK, unless
    the job's folder is named nodeK already (scalelab k8s --pvc, a folder given per node). Nodes
    started from one shared checkout share the default hydra.run.dir when started in the same
    second (or given one hydra.run.dir): node 1 replaced node 0's config (node 0's ranks ran
    with node_rank 1), its run.json and marks, and printed the comparison as if it held rank 0.
    Its checkpoints/ is the job folder's (a relative link): the ranks of every node write their
    parts of one checkpoint into one folder, as they did in the shared folder. A folder given per
    node (NAME/nodeK) links to node 0's, NAME/node0/checkpoints: node K's pipeline / DCP shards went
    to its own folder, which rank 0 never renamed, listed or pruned, and a resume failed to find them;
    and a sweep folder given per node (NAME/nodeK/NUM) to NAME/node0/NUM/checkpoints (its job NUM
    was NAME/nodeK/NUM/nodeK, its loss curves beside no checkpoint of node 0's)."""
    if not node_rank:
        return job_dir
    if job_dir.name == f"node{node_rank}":
        _link_checkpoints(job_dir, job_dir.parent / "node0" / "checkpoints", Path("..") / "node0" / "checkpoints")
        return job_dir
    if job_dir.parent.name == f"node{node_rank}":   # a sweep folder given per node (NAME/nodeK/NUM): as above
        node0 = job_dir.parent.parent / "node0" / job_dir.name
        _link_checkpoints(job_dir, node0 / "checkpoints", Path("..") / ".." / "node0" / job_dir.name / "checkpoints")
        return job_dir
    own = job_dir / f"node{node_rank}"
    own.mkdir(exist_ok=True)
    _link_checkpoints(own, job_dir / "checkpoints", Path("..") / "checkpoints")
    for h in logging.getLogger().handlers:   # Hydra's train.log: this node's lines into its own folder
        if isinstance(h, logging.FileHandler) and Path(h.baseFilename).parent == job_dir:
            h.close()   # reopened at the new name by its next line
            h.baseFilename = str(own / Path(h.baseFilename).name)
    return own


def _link_checkpoints(folder: Path, target: Path, relative: Path) -> None:
    """FOLDER/checkpoints as a relative link to TARGET (made first: a link to nothing fails the
    ranks' mkdir); a folder or link already there is left as it is."""
    link = folder / "checkpoints"
    if not link.exists() and not link.is_symlink():
        target.mkdir(parents=True, exist_ok=True)
        link.symlink_to(relative, target_is_directory=True)


@hydra.main(config_path=str(conf_dir()), config_name="train", version_base="1.3")
def _hydra_main(cfg: DictConfig) -> float | None:
    """Returns the objective for sweepers that optimize (Optuna): the final loss; None for a failed
    job or one with no final loss (the Optuna sweeper then records a failed trial and goes on; a NaN
    ended the search: scalelab.results.optuna_trials)."""
    try:
        record = run_job(cfg)
    except ConfigError as e:   # a value only the job sees (an Optuna trial's): one line, and the sweep goes on
        record = _refused(str(e))
    # no job runs now: a Ctrl-C from here (between jobs, in the sweep's summary) named this finished
    # job as the one it interrupted, and told how to resume it
    _MARKS["finished_dir"] = _MARKS.pop("job_dir", None)
    _MARKS.pop("stop_record", None)
    from scalelab.results.optuna_trials import objective

    return objective(record)


def _sweep_and_num(hc, multirun: bool) -> tuple[Path | None, int]:
    """The job's sweep folder and number: Hydra's in a multirun; the environment's for one job of a
    sweep run as a SLURM job (scalelab.slurm); (None, 0) for a single run."""
    if multirun:
        return Path(hc.sweep.dir).resolve(), hc.job.num
    if os.environ.get(SWEEP_ENV):
        return Path(os.environ[SWEEP_ENV]).resolve(), int(os.environ.get(NUM_ENV) or 0)
    return None, 0


def _refused(error: str) -> dict:
    """The job's ConfigError as a failed job (one line; its folder's records are left as they were),
    where before a traceback ended the job inside Hydra."""
    hc = HydraConfig.get()
    sweep_dir, num = _sweep_and_num(hc, hc.mode == RunMode.MULTIRUN)
    name = f"{sweep_dir.name}/{num}" if sweep_dir else Path(hc.runtime.output_dir).name
    error = redact_text(error)
    _FAILED.append(f"{name}: {error}")
    log.error(f"[scalelab] job {name} FAILED: {error}")
    return {"status": "failed", "error": error}


def main() -> None:
    _MARKS["launcher_start"] = timing.process_start_time() or timing.now()
    if requeue.in_slurm_job():
        # Until the ranks run (scalelab.requeue takes over), a warning signal to the batch step must
        # not kill the job (USR1's default action): under srun it is noted and passed on to the
        # ranks; with another launcher it is ignored, as the processes it starts inherit (a
        # Python handler would be reset to the default action in them)
        import signal

        if "launcher=srun" in sys.argv:
            requeue.install_batch_early()
            if os.environ.pop("SCALELAB_EARLY_USR1", "") == "1":   # the job script noted one (its --setup)
                requeue.EARLY.append(signal.SIGUSR1)
        else:
            signal.signal(signal.SIGUSR1, signal.SIG_IGN)
    register_override_secrets(sys.argv[1:])  # `+logger.api_key=XYZ`: redacted in every file and log line
    install_log_redaction()
    on_slurm = any(a.startswith("hydra/launcher=") and a != "hydra/launcher=basic" for a in sys.argv)
    runs = not any(a.split("=")[0] in _NO_JOB for a in sys.argv[1:])
    if runs and not on_slurm and ("launcher=local" in sys.argv or not any(a.startswith("launcher=") for a in sys.argv)):
        # The ranks' fork server imports the worker (~4 s) while preflight runs: no rank starts
        # until every job is valid, and the server dies with this process if one is not.
        spawn.start_server()
    if not requeue.in_slurm_job():   # (a SLURM batch step's SIGTERM is scalelab.requeue's)
        import signal

        # SIGTERM (`timeout`, `docker stop`, a pod's eviction) as Ctrl-C: the ranks are ended, one line
        # says how to go on; before, the command died silently, no line, its ranks on a broken pipe
        signal.signal(signal.SIGTERM, _terminated)
    try:
        _preflight(on_slurm)
    except KeyboardInterrupt as e:   # in the first seconds (imports, composing every job, data): one line
        spawn.stop_server()
        _stop(e)
    try:
        _hydra_main()   # Hydra's own errors, --help and --cfg end in sys.exit inside it
    except KeyboardInterrupt as e:   # the ranks were ended with it (spawn / launch kill their groups)
        _stop(e)
    finally:   # a fork server left importing outlived the command by 10 s and more
        spawn.stop_server()
    code = 0
    if _FAILED:  # the sweep went on past them; the command still says so
        print(f"error: {len(_FAILED)} job(s) failed:\n  " + "\n  ".join(_FAILED), file=sys.stderr)
        code = 1
    _fast_exit(code)


def _stop(e: KeyboardInterrupt) -> None:
    """Ctrl-C or SIGTERM: the line that says what it stopped and how to go on, and the exit code."""
    # on a terminal, the progress bar's line is still open (it rewrites itself with \r)
    how = (str(e) or "SIGTERM") if isinstance(e, _Terminated) else "Ctrl-C"
    _record_stop(how, 143 if how.startswith("SIGTERM") else 130)
    print(("\n" if sys.stderr.isatty() else "") + _interrupted(_MARKS.get("job_dir"), _MARKS.get("sweep_dir"), how,
                                                              _MARKS.get("run_dir")), file=sys.stderr)
    _fast_exit(143 if how.startswith("SIGTERM") else 130)


def _preflight(on_slurm: bool) -> None:
    """Every job of the command validated before any starts (one line, exit 2, for a bad one)."""
    from scalelab.preflight import preflight

    try:
        if on_slurm and any(a.startswith("hydra/launcher=slurm") for a in sys.argv):
            from scalelab.slurm import refuse_secrets

            try:
                refuse_secrets([a for a in sys.argv[1:] if not a.startswith("-")])
            except ValueError as e:
                raise ConfigError(str(e)) from None
        # a sweep on SLURM: every job runs launcher=srun there (its layout is checked as such)
        preflight([*sys.argv[1:], *(["launcher=srun"] if on_slurm and not any(
            a.startswith("launcher=") for a in sys.argv) else [])], elsewhere=on_slurm)
        _MARKS["preflight_done"] = timing.now()
    except ConfigError as e:
        print(f"error: {redact_text(str(e))}", file=sys.stderr)
        spawn.stop_server()
        sys.exit(2)


class _Terminated(KeyboardInterrupt):
    """SIGTERM, raised where Ctrl-C's KeyboardInterrupt would be."""


def _terminated(signum, frame) -> None:
    raise _Terminated()


def _record_stop(how: str, rc: int) -> None:
    """The record of the job a Ctrl-C or SIGTERM stopped once its ranks ran (none was written: an
    interrupted sweep's job was missing from `scalelab compare`), unless they completed it. Never
    in the way of the exit."""
    job_dir, resolved, spec, threads, layout = _MARKS.get("stop_record") or (None,) * 5
    if job_dir is None or _completed_since(job_dir / RUN_FILE, _attempt_since(job_dir)):
        return
    try:
        write_json(job_dir / RUN_FILE, scrub(stopped_record(job_dir, resolved, spec, threads, how, rc, layout)))
    except Exception as exc:  # noqa: BLE001 - the exit line still comes
        print(f"[scalelab] the stopped job's record was not written ({type(exc).__name__}: {exc})", file=sys.stderr)


def _attempt_since(job_dir: Path) -> float:
    """When this attempt began: Hydra's files of it in the same folder (one file system's clock:
    the launcher's may differ from a shared file server's), else the launcher's clock."""
    hydra_cfg = job_dir / ".hydra" / "config.yaml"
    return hydra_cfg.stat().st_mtime if hydra_cfg.is_file() else _MARKS.get("job_start", 0.0)


def _interrupted(job_dir: Path | None, sweep_dir: Path | None = None, signame: str = "Ctrl-C",
                 run_dir: Path | None = None) -> str:
    finished = _MARKS.get("finished_dir")
    since = _attempt_since(job_dir) if job_dir is not None else 0.0
    if job_dir is not None and _completed_since(job_dir / RUN_FILE, since):
        job_dir, finished = None, job_dir   # its ranks wrote its completed record: it is not the one stopped
    return run_end.interrupted_line(job_dir, sweep_dir, signame, run_dir, _MARKS.get("max_steps"),
                                    _MARKS.get("every_n_steps"), finished=finished)


def _completed_since(path: Path, since: float) -> bool:
    """Whether `path` is a completed record written since `since` (this attempt's, not an earlier
    run's in the same folder, which a rerun with a larger trainer.max_steps goes on from)."""
    try:
        return path.stat().st_mtime >= since and json.loads(path.read_text()).get("status") == "completed"
    except (OSError, ValueError, AttributeError):
        return False


def _fast_exit(code: int) -> None:
    """Exit without the interpreter's teardown of torch and Lightning (~1 s measured): every job's
    files are written and closed, its ranks are gone, W&B runs are finished."""
    spawn.stop_server()  # idle now; left alone it would hold our stdout open through its own teardown (~1 s)
    sys.stdout.flush()
    sys.stderr.flush()
    logging.shutdown()
    os._exit(code)


if __name__ == "__main__":
    main()

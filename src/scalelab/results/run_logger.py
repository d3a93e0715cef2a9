"""The job's metrics logger, built on every rank (Lightning logs from global rank 0 only): W&B
(offline by default; online falls back to offline when init fails), CSV, or none; the W&B run's id
kept in the job folder so a resumed job continues its run; the config W&B shows; the summary
logged at the end of a job."""
from __future__ import annotations

import os
from pathlib import Path

from omegaconf import OmegaConf

from scalelab.results.record import lr_rule_label, max_of, scrub


def global_rank() -> int:
    return int(os.environ.get("RANK", os.environ.get("SLURM_PROCID", 0)))


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
    from scalelab.results.record import redact_argv

    # W&B keeps the command line in the run's metadata; a rank's argv is only read from here on
    redact_argv()

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
    if cfg.logger.mode != "online" or global_rank() != 0:
        return logger
    try:
        logger.experiment  # noqa: B018 - wandb.init
        return logger
    except Exception as exc:  # noqa: BLE001 - wandb raises UsageError, CommError, AuthenticationError, ...
        import wandb

        why = (str(exc).strip().splitlines() or [""])[0][:200]
        print(f"[scalelab] warning: W&B online init failed ({type(exc).__name__}: {why}); logging offline "
              f"instead: sync later with `wandb sync {job_dir}/wandb/offline-run-*`", flush=True)
        # W&B's service keeps the failed run's id ("run ID ... is in use"): a new service, and the offline
        # run is the job's own (a new id made a requeued attempt's offline run another run once synced)
        try:
            wandb.teardown()
        except Exception:  # noqa: BLE001 - nothing was started
            pass
        return make("offline")


WANDB_ID = ".wandb_run_id"  # JOB_DIR/.wandb_run_id: the job's W&B run, continued when the job resumes


def _wandb_identity(job_dir: Path, resumed: bool) -> dict:
    """A job resumed from its own checkpoint (requeued, restarted) continues its W&B run: the same
    id, resume="allow"; a fresh job gets a new id, saved for its resumptions. Only rank 0 creates
    the run (Lightning), so only rank 0 reads or writes the id."""
    if global_rank() != 0:
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


def log_summary(logger, record: dict) -> None:
    if not logger:
        return
    summary = {"throughput/samples_per_s": record["throughput"]["samples_per_s"],
               "step_time/median_s": record["step_time_s"]["median"],
               "step_time/p90_s": record["step_time_s"]["p90"],
               "memory/peak_rss_bytes_max": max(record["memory"]["peak_rss_bytes_per_rank"]),
               "memory/model_state_bytes_max": max(record["memory"]["model_state_bytes_per_rank"]),
               "loss/final": record["loss"]["final"], "lr/used": record["lr"]}
    # the device's own peak (GPUs): the memory a run is short of; RSS above is host memory only
    device = max_of(record["memory"].get("peak_device_bytes_per_rank"))
    if device is not None:
        summary["memory/peak_device_bytes_max"] = device
    if record.get("mfu") and record["mfu"].get("value") is not None:
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
        # status and error as run.json has them: an attempt that failed had them set (mark_failed) in
        # the run this resumed attempt continues, which `wandb sync` merges
        logger.finish({**summary, "status": record["status"], "error": record.get("error")})   # one run per job
    else:
        logger.save()


def wandb_folders(job_dir: Path) -> set[str]:
    """The names of the job's W&B run folders (offline-run-TS-ID, run-TS-ID): each init makes one."""
    return {f.name for f in (Path(job_dir) / "wandb").glob("*run-*-*") if f.is_dir()}


def mark_failed(job_dir: Path, logger_cfg: dict, error: str, cache_dir: Path | None = None,
                earlier: set[str] | None = None) -> None:
    """The job's W&B run ends failed, with the error in its summary, when the job failed: rank 0 had
    closed it as finished when the job failed after its record (a peer in its teardown,
    trainer.timeout_s in an exit that hung: job_outcome.collect's failed_after_record), or never
    closed it, ended by the launcher (trainer.timeout_s, a peer's failure): run.json said failed,
    W&B finished OK or nothing at all (found by review). Only a run this attempt's rank 0 began (a
    W&B folder of its id not among EARLIER, the folders before its ranks started; no clock is
    compared): an earlier attempt's run is not this failure.
    The launcher resumes the run by its id (offline: another offline-run-*-ID folder of it, which
    `wandb sync` joins), adds status and error to its summary and closes it with exit code 1."""
    import sys

    path = Path(job_dir) / WANDB_ID
    if (logger_cfg or {}).get("name") != "wandb" or logger_cfg.get("mode") == "disabled" or not path.exists():
        return
    run_id = path.read_text().strip()
    folders = {f for f in wandb_folders(job_dir) if f.endswith(f"-{run_id}")}   # this run's, every attempt's
    if not run_id or (earlier is not None and not folders - earlier):
        return
    # online only where the job's run is online: one that fell back offline left offline folders alone
    offline = logger_cfg.get("mode") != "online" or any(f.startswith("offline-") for f in folders)
    from scalelab.paths import default_wandb_env
    from scalelab.results.record import redact_argv

    default_wandb_env(cache_dir)   # where the ranks keep W&B's cache and settings

    argv = redact_argv()   # W&B keeps sys.argv in the run's metadata
    try:
        import wandb

        run = wandb.init(id=run_id, resume="allow", mode="offline" if offline else "online", dir=str(job_dir),
                         project=logger_cfg.get("project"), entity=logger_cfg.get("entity"), reinit="create_new")
        run.summary.update({"status": "failed", "error": error})
        run.finish(exit_code=1)
    except Exception as e:  # noqa: BLE001 - the record says failed whatever W&B does
        print(f"[scalelab] warning: the job's W&B run {run_id} still reads finished: it could not be marked failed "
              f"({type(e).__name__}: {(str(e).strip().splitlines() or [''])[0][:200]})", file=sys.stderr)
    finally:
        sys.argv[:] = argv

"""Sweep aggregation: scaling efficiency of runs that differ only in world size.

Two groupings, each against the smallest world size in the group (the baseline):
- strong scaling: same global batch (each rank does less work as N grows);
- weak scaling: same per-rank batch (the global batch grows with N).
efficiency(N) = throughput(N) / (N x throughput(N0) / N0)
(throughput(N0): the median of the baseline's repeats, where a sweep ran it more than once)

A group holds every node layout of its world sizes (1 node x 2 devices and 2 nodes x 1 device are
both N = 2), each run with its own efficiency; the baseline is chosen, never left to folder order
(baseline_key): the smallest world, a steady run before a short one, the fewest nodes.
"""
from __future__ import annotations

import json
import os
import statistics
from collections import defaultdict
from pathlib import Path

from scalelab.paths import SWEEP_MARKS
from scalelab.same_job import MEASURED_LOGGER
from scalelab.results.record import RUN_FILE, num_nodes, read_records, write_json

SWEEP_FILE = "sweep.json"
# Keys that legitimately change with the world size inside one scaling group. Not
# data.micro_batch_size: the user's setting (null: global / data-parallel ranks) is the same at
# every world size of a scaling series; runs that set it differently are different series (a sweep
# over micro-batch sizes put micro 16 and micro 4 in one group, against one arbitrary baseline).
_WORLD_KEYS = {"trainer.devices", "trainer.num_nodes", "data.global_batch_size"}
# Config keys (dotted prefixes) that change nothing a run measures: where its files, logs and
# checkpoints go (saves are in no step's time: scaling.metrics restart_clock), how it is launched
# and given up on. Not part of a scaling group's identity: launcher=torchrun's rdzv_id is set per
# job, so every job of such a sweep was a group of its own and the sweep had no efficiency at all.
# Not launcher.name or launcher.extra_args: srun's --cpu-bind or --hint change the speed. The
# dashboard's series pool these too (chart_base._POOLED).
NOT_MEASURED = ("job.", "hydra.", "logger.", "cache_dir", "verbose", "launcher.rdzv_", "launcher.node_rank",
                "checkpoint.", "trainer.timeout_s", "trainer.collective_timeout_s", "trainer.max_restarts",
                "trainer.enable_progress_bar",
                # the profile MFU is divided by (hardware, hardware.*, hardware_profile): the same run,
                # not another series (it split one)
                "hardware")
# ...but which logger, and W&B's mode, are measured (same_job.MEASURED_LOGGER): logger=none,csv
# were pooled as repeats of one baseline 19 % apart. Its project, entity and tags are not.


def not_measured(key: str) -> bool:
    """A dotted config key that changes nothing a run measures (NOT_MEASURED, but MEASURED_LOGGER)."""
    return key.startswith(NOT_MEASURED) and key not in MEASURED_LOGGER


# What a record says of its run at its top level that no world size changes (not parallel.*, lr,
# threads_per_rank, ...). A record without a config block was grouped by nothing at all: every
# strategy's runs shared one baseline (single x2 got 2.78 against ddp x1); and a config's
# trainer.accelerator=auto does not say whether the run had a GPU. So every record is grouped by
# these too.
_SETTINGS = ("strategy", "precision", "optimizer", "lr_rule", "lr_decay", "base_lr", "activation_checkpointing",
             "max_steps", "seed")


def _settings(rec: dict) -> dict:
    model = rec.get("model")
    if isinstance(model, dict):   # its name and shape; n_params is a count, not a setting
        model = {k: v for k, v in model.items() if k != "n_params"}
    return {**{k: rec.get(k) for k in _SETTINGS}, "model": model,
            "accelerator": (rec.get("hardware") or {}).get("accelerator")}


def _identity(rec: dict) -> str:
    cfg = rec.get("config") or {}
    # lr_scaling.base_batch_size follows the global batch under rule none (conf/lr_scaling/none.yaml)
    # and scales nothing there; under a scaling rule it sets the LR used, so runs that differ in it
    # are different series (they were pooled: two runs at one world size in one group)
    world = _WORLD_KEYS | ({"lr_scaling.base_batch_size"}
                           if (cfg.get("lr_scaling") or {}).get("rule", "none") == "none" else set())
    flat = {f"record.{k}": v for k, v in _settings(rec).items()}
    for group, sub in cfg.items():
        for key, v in (sub.items() if isinstance(sub, dict) else [(None, sub)]):
            name = f"{group}.{key}" if key is not None else group
            if name not in world and not not_measured(name):
                flat[name] = v
    return json.dumps(sorted(flat.items()), default=str)


def per_rank_batch(rec: dict) -> int:
    """The global batch over the data-parallel ranks (a weak-scaling series' constant)."""
    return (rec.get("global_batch_size") or 0) // max(1, (rec.get("parallel") or {}).get("dp")
                                                      or rec.get("world_size") or 1)


def efficiency(thr: float, world: int, base_thr: float, base_world: int) -> float:
    return thr / (world * base_thr / base_world)


def baseline_key(rec: dict) -> tuple:
    """The order the baseline is the first of: the smallest world size; there, a run with enough
    measured steps before a short_run one (a few steps' throughput is no steady figure, and every
    efficiency is divided by it); then the fewest nodes (the intra-node layout, with no network
    in its figure); then the job folder, so the choice never depends on the order folders are read."""
    return (rec["world_size"], bool(rec.get("short_run")), num_nodes(rec),
            str((rec.get("job") or {}).get("record_path") or ""), str((rec.get("job") or {}).get("name") or ""))


def aggregate(sweep_dir: Path | str, write: bool = True, problems: list[str] | None = None) -> dict:
    """The sweep's summary. run.json files that cannot be used (corrupt, truncated, wrongly
    shaped: results.record.record_problem) are skipped and listed in `skipped` ("PATH: reason",
    also appended to `problems` when given); they never stop the aggregation."""
    sweep_dir = Path(sweep_dir)
    skipped: list[str] = []
    records = read_records([sweep_dir], skipped)
    if problems is not None:
        problems.extend(skipped)
    completed = [r for r in records if r.get("status") == "completed"]
    # Efficiency needs a throughput: a completed run without one (no steady step) is counted
    # completed and listed as unmeasured, never silently dropped.
    ok = [r for r in completed if (r.get("throughput") or {}).get("samples_per_s")]
    groups = []
    for kind, extra in (("strong", lambda r: r["global_batch_size"]), ("weak", per_rank_batch)):
        buckets: dict[tuple, list[dict]] = defaultdict(list)
        for r in ok:
            buckets[(_identity(r), extra(r))].append(r)
        for members in buckets.values():
            worlds = {m["world_size"] for m in members}
            if len(worlds) < 2 or (kind == "weak" and len({m["global_batch_size"] for m in members}) < 2):
                continue  # a weak group whose global batch never changed is the strong group again
            base = min(members, key=baseline_key)
            # repeats of the baseline (runs differing only in NOT_MEASURED keys, e.g. a torchrun rdzv_id):
            # their median, as the charts draw repeats; against the first folder's alone, a 1-rank
            # repeat read 0.83 and the chart's line started below the ideal one (found by review)
            repeats = [m for m in members if baseline_key(m)[:3] == baseline_key(base)[:3]]
            b_thr = statistics.median(m["throughput"]["samples_per_s"] for m in repeats)
            b_world = base["world_size"]
            groups.append({
                "kind": kind, "strategy": base["strategy"], "baseline_job": base["job"].get("name"),
                "baseline_dir": _rel(base, sweep_dir),
                "baseline_world_size": b_world, "baseline_num_nodes": num_nodes(base),
                "baseline_samples_per_s": b_thr, "baseline_repeats": len(repeats),
                # every run at the smallest world was short: the efficiencies are against a figure
                # that is not steady-state (the table and charts say so)
                "baseline_short_run": bool(base.get("short_run")),
                "runs": [{"job": m["job"].get("name"), "dir": _rel(m, sweep_dir), "world_size": m["world_size"],
                          "num_nodes": num_nodes(m), "global_batch_size": m["global_batch_size"],
                          "samples_per_s": m["throughput"]["samples_per_s"],
                          # fewer than 5 measured steps: its efficiency is no steady figure either
                          "short_run": bool(m.get("short_run")),
                          "scaling_efficiency": efficiency(m["throughput"]["samples_per_s"], m["world_size"],
                                                           b_thr, b_world)}
                         for m in sorted(members, key=lambda m: (m["world_size"], num_nodes(m),
                                                                 str(m["job"].get("record_path") or "")))],
            })
    failed = [{"job": r["job"].get("name"), "strategy": r.get("strategy"), "world_size": r.get("world_size"),
               "error": r.get("error")} for r in records if r.get("status") != "completed"]
    unmeasured = [r["job"].get("name") for r in completed if r not in ok]
    no_record = jobs_without_record(sweep_dir)
    # resolved, as run.json's job.sweep_dir: the runs' `dir`s are relative to it, whoever reads it
    summary = {"sweep_dir": str(sweep_dir.resolve()), "num_runs": len(records), "num_completed": len(completed),
               "num_failed": len(failed), "failed": failed, "num_unmeasured": len(unmeasured),
               "unmeasured": unmeasured, "num_skipped": len(skipped), "skipped": skipped,
               "num_no_record": len(no_record), "no_record": no_record, "groups": groups}
    if write:
        write_json(sweep_dir / SWEEP_FILE, {**_kept(sweep_dir / SWEEP_FILE), **summary})
    return summary


NO_RECORD_WHY = ("no run.json: its launcher was killed before it recorded (kill -9, the OOM killer), it was "
                 "refused before its ranks started, or it is still running; its train.log and ranks.log say which")
# What a job folder holds from its start (the launcher writes them before any rank runs)
_JOB_MARKS = ("config_resolved.yaml", ".hydra")


def jobs_without_record(sweep_dir: Path) -> list[str]:
    """The sweep's job folders (relative names) with no run.json under them: a job whose launcher
    was killed (kill -9, the OOM killer) before it recorded, or one still running. A failed job
    has a record (status failed); these had none, and the sweep's headline, sweep.json and
    dashboard counted only the jobs that had one (found by review: `1 completed, 0 failed` for a
    sweep of two jobs, the killed one's ranks.log and error files beside it)."""
    if not sweep_dir.is_dir():
        return []
    dirs = [d for d in sweep_dir.iterdir() if d.is_dir() and any((d / m).exists() for m in _JOB_MARKS)]
    return [d.name for d in sorted(dirs, key=lambda d: (not d.name.isdigit(), int(d.name) if d.name.isdigit() else 0,
                                                        d.name))
            if not any(d.rglob(RUN_FILE))]


def _kept(path: Path) -> dict:
    """What an earlier sweep.json recorded that aggregation cannot recompute (the W&B summary
    run's id), so re-aggregating a sweep keeps it."""
    try:
        old = json.loads(path.read_text())
    except (OSError, ValueError):
        return {}
    return {k: old[k] for k in ("wandb_run_id",) if isinstance(old, dict) and k in old}


def _rel(rec: dict, sweep_dir: Path) -> str | None:
    """The run's job folder relative to its sweep folder ("1"): with the sweep folder, where the run
    is. A job name is not (two sweeps in folders named `sw` both have a job "sw/1"), and a
    relative path still holds for a copied or moved sweep."""
    path = (rec.get("job") or {}).get("record_path")
    return os.path.relpath(Path(path).parent, sweep_dir) if path else None


def job_key(rec: dict) -> str | None:
    """Where a record's job is: its resolved job folder (None for a record not read from a file)."""
    path = (rec.get("job") or {}).get("record_path")
    return str(Path(path).parent.resolve()) if path else None


def run_key(summary: dict, run_dir: str | None) -> str | None:
    """Where a summary's run (its `dir`, or a group's `baseline_dir`) is, as job_key says it."""
    if run_dir is None or not summary.get("sweep_dir"):
        return None
    return str((Path(summary["sweep_dir"]) / run_dir).resolve())


def summary_run_id(sweep_dir: Path | str) -> str | None:
    """The W&B summary run an earlier aggregation of SWEEP_DIR logged (sweep.json), to resume."""
    run_id = _kept(Path(sweep_dir) / SWEEP_FILE).get("wandb_run_id")
    return run_id if isinstance(run_id, str) and run_id else None


def attach_efficiency(records: list[dict], summary: dict) -> None:
    """Put each run's efficiency (strong preferred; a run in both kinds of group also gets
    weak_scaling_efficiency), its group's baseline world size and whether
    that baseline was a short run on its record, for tables (a group whose 1-device run failed or
    is missing is measured against its smallest completed world, and the table says so). Runs are
    matched by where they are (their job folder in the summary's sweep), so SUMMARY's figures land
    on its own runs only: keyed by job name, a sweep `A/sw` showed `B/sw`'s efficiency for its job
    "sw/1". Only where one side has no folder (a record not read from a file, an older summary) is
    a run matched by job name."""
    strong_last = sorted(summary["groups"], key=lambda g: g["kind"] != "weak")  # strong written last wins
    figures_of = _run_lookup(summary, [(run, (run["scaling_efficiency"], g["baseline_world_size"], g["kind"],
                                              bool(g.get("baseline_short_run"))))
                                       for g in strong_last for run in g["runs"]])
    weak_of = _run_lookup(summary, [(run, run["scaling_efficiency"]) for g in summary["groups"] if g["kind"] == "weak"
                                    for run in g["runs"]])
    for r in records:
        figures = figures_of(r)
        if figures:
            (r["scaling_efficiency"], r["scaling_baseline_world"], r["scaling_kind"],
             r["scaling_baseline_short"]) = figures
        weak = weak_of(r)
        if weak is not None:
            # its weak figure too (JSON, CSV, --sort/--where): the table's column is the strong one,
            # and a weak group's runs are nearly all in a strong group (review: sweep.json only)
            r["weak_scaling_efficiency"] = weak


def _run_lookup(summary: dict, pairs: list[tuple[dict, object]]):
    """record -> the value paired with its run in SUMMARY (later pairs win), matched as
    attach_efficiency says: by job folder, by job name only where one side has no folder."""
    by_dir: dict[str, object] = {}
    by_name: dict[str, object] = {}     # every run
    no_dir: dict[str, object] = {}      # runs without a folder
    for run, value in pairs:
        by_name[run["job"]] = value
        key = run_key(summary, run.get("dir"))
        (by_dir if key else no_dir)[key or run["job"]] = value

    def find(r: dict):
        key, name = job_key(r), (r.get("job") or {}).get("name")
        if not key:
            return by_name.get(name)
        return by_dir[key] if key in by_dir else no_dir.get(name)

    return find


def has_job_section(rec: dict) -> bool:
    """Whether the record has the `job` section train.py (or slurm.finalize) writes: every record
    since sweeps were recorded. read_records adds job.record_path to every record, so that key
    alone is no section: a very old record."""
    return any(k != "record_path" for k in (rec.get("job") or {}))


def recorded_sweep(job_dir: Path, sweep_dir: str | None, recorded_job: str | None = None) -> Path | None:
    """The sweep folder of a job in JOB_DIR (resolved) whose record names SWEEP_DIR: that folder
    where it is above JOB_DIR; where the sweep was moved, the nearest folder above JOB_DIR of the
    same name; where it was renamed too, the nearest folder above JOB_DIR that is a sweep's
    (multirun.yaml or sweep.json) and holds JOB_DIR where the sweep held the job's recorded folder
    RECORDED_JOB (its job.dir: "1" below either). None for a single run (no sweep_dir) and for a
    record outside its sweep (a copied run.json): no folder that happens to hold it is its sweep."""
    if not sweep_dir:
        return None
    recorded = Path(sweep_dir)
    if recorded.is_absolute() and recorded.resolve() in job_dir.parents:   # train.py records it resolved
        return recorded.resolve()
    named = next((folder for folder in job_dir.parents if recorded.name and folder.name == recorded.name), None)
    if named is not None or not recorded_job:
        return named
    try:
        rel = Path(recorded_job).relative_to(recorded)
    except ValueError:   # the recorded job folder was not inside the recorded sweep
        return None
    return next((folder for folder in job_dir.parents if rel.parts and job_dir.relative_to(folder) == rel
                 and any((folder / mark).is_file() for mark in SWEEP_MARKS)), None)


def sweep_of_record(rec: dict, given: set[str] = frozenset()) -> Path | None:
    """The sweep folder a record belongs to: its job.sweep_dir where that is above its job folder
    (recorded_sweep), whatever folder the user named; None for a single run (job.sweep_dir null or
    missing: no sweep, so no scaling efficiency) and for a record away from its sweep. Only a very
    old record without a job section is placed by folders: its job folder's parent where the user
    named that folder (GIVEN, resolved) or where it holds multirun.yaml or sweep.json. Before,
    those folder rules came first for every record: `compare outputs/slurm` pooled a SLURM array's
    tasks and a single run beside them against another array's baseline."""
    key = job_key(rec)
    if key is None:
        return None
    job_dir = Path(key)
    if has_job_section(rec):
        return recorded_sweep(job_dir, rec["job"].get("sweep_dir"), rec["job"].get("dir"))
    parent = job_dir.parent
    if str(parent) in given or any((parent / mark).is_file() for mark in SWEEP_MARKS):
        return parent
    return None


def summaries_for(records: list[dict], given: list[str | Path] = ()) -> list[dict]:
    """Each sweep the records come from (sweep_of_record: the sweep folder their job.sweep_dir
    names), aggregated in full (not written) and its efficiencies attached to the records: a run
    shows the efficiency its sweep's sweep.json holds, whether the sweep, its parent folder or some
    of its job folders were named. A record with no sweep (a single run, a copied run.json) causes
    no folder to be read."""
    named = {str(Path(p).resolve()) for p in given if Path(p).is_dir()}
    sweeps = list(dict.fromkeys(s for r in records if (s := sweep_of_record(r, named)) is not None))
    summaries = []
    for sweep in sweeps:
        summaries.append(aggregate(sweep, write=False))
        attach_efficiency(records, summaries[-1])
    return [s for s in summaries if s["num_runs"]]

"""Sweep aggregation: scaling efficiency of runs that differ only in world size.

Two groupings, each against the smallest world size in the group (the baseline):
- strong scaling: same global batch (each rank does less work as N grows);
- weak scaling: same per-rank batch (the global batch grows with N).
efficiency(N) = throughput(N) / (N x throughput(N0) / N0)
"""
from __future__ import annotations

import json
from collections import defaultdict
from pathlib import Path

from scalelab.results.record import read_records, write_json

SWEEP_FILE = "sweep.json"
# Keys that legitimately change with the world size inside one scaling group. Not
# data.micro_batch_size: the user's setting (null: global / data-parallel ranks) is the same at
# every world size of a scaling series; runs that set it differently are different series (a sweep
# over micro-batch sizes put micro 16 and micro 4 in one group, against one arbitrary baseline).
_WORLD_KEYS = {("trainer", "devices"), ("trainer", "num_nodes"), ("data", "global_batch_size"),
               ("lr_scaling", "base_batch_size")}


def _identity(rec: dict) -> str:
    cfg = {k: v for k, v in (rec.get("config") or {}).items() if k not in ("job", "hydra")}
    flat = {}
    for group, sub in cfg.items():
        if isinstance(sub, dict):
            flat.update({(group, k): v for k, v in sub.items() if (group, k) not in _WORLD_KEYS})
        else:
            flat[(group,)] = sub
    return json.dumps(sorted((".".join(k), v) for k, v in flat.items()), default=str)


def _per_rank_batch(rec: dict) -> int:
    return rec["global_batch_size"] // max(1, rec.get("parallel", {}).get("dp", rec["world_size"]))


def efficiency(thr: float, world: int, base_thr: float, base_world: int) -> float:
    return thr / (world * base_thr / base_world)


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
    for kind, extra in (("strong", lambda r: r["global_batch_size"]), ("weak", _per_rank_batch)):
        buckets: dict[tuple, list[dict]] = defaultdict(list)
        for r in ok:
            buckets[(_identity(r), extra(r))].append(r)
        for members in buckets.values():
            worlds = {m["world_size"] for m in members}
            if len(worlds) < 2 or (kind == "weak" and len({m["global_batch_size"] for m in members}) < 2):
                continue  # a weak group whose global batch never changed is the strong group again
            base = min(members, key=lambda m: m["world_size"])
            b_thr, b_world = base["throughput"]["samples_per_s"], base["world_size"]
            groups.append({
                "kind": kind, "strategy": base["strategy"], "baseline_job": base["job"].get("name"),
                "baseline_world_size": b_world, "baseline_samples_per_s": b_thr,
                "runs": [{"job": m["job"].get("name"), "world_size": m["world_size"],
                          "global_batch_size": m["global_batch_size"],
                          "samples_per_s": m["throughput"]["samples_per_s"],
                          "scaling_efficiency": efficiency(m["throughput"]["samples_per_s"], m["world_size"],
                                                           b_thr, b_world)}
                         for m in sorted(members, key=lambda m: m["world_size"])],
            })
    failed = [{"job": r["job"].get("name"), "strategy": r.get("strategy"), "world_size": r.get("world_size"),
               "error": r.get("error")} for r in records if r.get("status") != "completed"]
    unmeasured = [r["job"].get("name") for r in completed if r not in ok]
    summary = {"sweep_dir": str(sweep_dir), "num_runs": len(records), "num_completed": len(completed),
               "num_failed": len(failed), "failed": failed, "num_unmeasured": len(unmeasured),
               "unmeasured": unmeasured, "num_skipped": len(skipped), "skipped": skipped, "groups": groups}
    if write:
        write_json(sweep_dir / SWEEP_FILE, {**_kept(sweep_dir / SWEEP_FILE), **summary})
    return summary


def _kept(path: Path) -> dict:
    """What an earlier sweep.json recorded that aggregation cannot recompute (the W&B summary
    run's id), so re-aggregating a sweep keeps it."""
    try:
        old = json.loads(path.read_text())
    except (OSError, ValueError):
        return {}
    return {k: old[k] for k in ("wandb_run_id",) if isinstance(old, dict) and k in old}


def attach_efficiency(records: list[dict], summary: dict) -> None:
    """Put each run's efficiency (strong preferred) and its group's baseline world size on its
    record, for tables (a group whose 1-device run failed or is missing is measured against its
    smallest completed world, and the table says so)."""
    by_job: dict[str, tuple[float, int, str]] = {}
    for g in sorted(summary["groups"], key=lambda g: g["kind"] != "weak"):  # strong written last wins
        for run in g["runs"]:
            by_job[run["job"]] = (run["scaling_efficiency"], g["baseline_world_size"], g["kind"])
    for r in records:
        if r.get("job", {}).get("name") in by_job:
            r["scaling_efficiency"], r["scaling_baseline_world"], r["scaling_kind"] = by_job[r["job"]["name"]]

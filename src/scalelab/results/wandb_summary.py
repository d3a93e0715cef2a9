"""A sweep-summary W&B run: one table of the sweep's runs and their scaling efficiencies, and the
dashboard's charts (efficiency, throughput, memory, loss, LR rule, breakdown, planner) as W&B custom
charts, in the same W&B group as the sweep's job runs so dashboards compare them side by side."""
from __future__ import annotations

from pathlib import Path

from scalelab.paths import default_wandb_env
from scalelab.results.record import max_of, num_nodes
from scalelab.results.table import sort_key

RUN_COLUMNS = ["job", "strategy", "world_size", "num_nodes", "global_batch_size", "per_device_batch_size",
               "accumulate_grad_batches", "lr", "samples_per_s", "tokens_per_s", "step_time_median_s",
               "step_time_p90_s", "peak_rss_bytes_max", "peak_device_bytes_max", "mfu", "loss_final",
               "scaling_efficiency", "scaling_kind", "scaling_baseline_world", "status", "error"]


def _row(r: dict) -> list:
    """One run as RUN_COLUMNS. The device's own peak (GPUs; None on CPU) beside the host RSS: on a
    GPU the RSS says nothing of the memory that runs out."""
    mem = r.get("memory") or {}
    return [r.get("job", {}).get("name"), r.get("strategy"), r.get("world_size"), num_nodes(r),
            r.get("global_batch_size"), r.get("per_device_batch_size"), r.get("accumulate_grad_batches"), r.get("lr"),
            r.get("throughput", {}).get("samples_per_s"), r.get("throughput", {}).get("tokens_per_s"),
            r.get("step_time_s", {}).get("median"), r.get("step_time_s", {}).get("p90"),
            max_of(mem.get("peak_rss_bytes_per_rank")), max_of(mem.get("peak_device_bytes_per_rank")),
            (r.get("mfu") or {}).get("value"), r.get("loss", {}).get("final"),
            # strong or weak, and against which world size: one column held both kinds, unlabelled
            r.get("scaling_efficiency"), r.get("scaling_kind"), r.get("scaling_baseline_world"), r.get("status"),
            r.get("error")]


def charts(records: list[dict], summary: dict, cache_dir: Path | None = None) -> dict:
    """The dashboard's charts (results/charts.py) as W&B custom charts, keyed `charts/<id>`: lines
    as wandb.plot.line (one stroke per series), bars as wandb.plot.bar (one bar per x and series)."""
    import wandb

    from scalelab.results.charts import all_charts

    out = {}
    for ch in all_charts(records, [summary], cache=cache_dir):
        if not ch["traces"]:
            continue
        if ch["kind"] == "bar":
            table = wandb.Table(columns=["bar", ch["y_title"]],
                                data=[[f"{x} {t['name']}", y] for t in ch["traces"] for x, y in zip(t["x"], t["y"])])
            out[f"charts/{ch['id']}"] = wandb.plot.bar(table, "bar", ch["y_title"], title=ch["title"])
        else:
            table = wandb.Table(columns=[ch["x_title"], ch["y_title"], "series"],
                                data=[[x, y, t["name"]] for t in ch["traces"] for x, y in zip(t["x"], t["y"])])
            out[f"charts/{ch['id']}"] = wandb.plot.line(table, ch["x_title"], ch["y_title"], stroke="series",
                                                        title=ch["title"])
    return out


def _nodes_tag(run: dict) -> str:
    n = run.get("num_nodes") or 1
    return f"n{n}" if n > 1 else ""


def log_sweep(sweep_dir: Path, summary: dict, records: list[dict], project: str, mode: str,
              entity: str | None = None, cache_dir: Path | None = None, run_id: str | None = None) -> str:
    """Log the summary run; returns its id. Offline runs land in SWEEP_DIR/wandb/. RUN_ID (the id
    an earlier aggregation of this sweep logged, sweep.json's wandb_run_id) is resumed, so a sweep
    has one summary run however often it is aggregated: without it every re-aggregation (a rerun
    into the same sweep dir, `scalelab aggregate DIR --wandb ...`) made another. Offline, each
    aggregation is its own offline-run-*-ID folder of that one id; `wandb sync` puts them in one run."""
    import wandb

    # absolute: a relative dir (`scalelab aggregate fx`) was resolved by W&B's service process, whose
    # working folder is the one it started in, and the offline run landed there, not in fx/wandb
    sweep_dir = Path(sweep_dir).resolve()
    default_wandb_env(cache_dir)
    # the W&B group its job runs are in (train.py's job.group, which results.run_logger logs them with), so
    # the summary sits beside them whatever that group is; the folder's name where no record says
    groups = {(r.get("job") or {}).get("group") for r in records} - {None, ""}
    group = groups.pop() if len(groups) == 1 else Path(sweep_dir).name
    kw = dict(project=project, entity=entity, dir=str(sweep_dir), group=group,
              job_type="sweep_summary", name=f"{group}/summary",   # the jobs' group: NAME, not a k8s sweep's node0
              config={"sweep_dir": str(sweep_dir), "num_runs": summary["num_runs"]}, reinit="create_new",
              **({"id": run_id, "resume": "allow"} if run_id else {}))
    import sys

    from scalelab.results.record import redact_argv

    argv = redact_argv()   # W&B keeps sys.argv in the run's metadata: the sweep's command, secrets and all
    try:
        try:
            run = wandb.init(mode=mode, **kw)
        except Exception as exc:  # noqa: BLE001 - online without a key or network: log it offline, say how to sync
            if mode != "online":
                raise
            why = (str(exc).strip().splitlines() or [""])[0][:200]
            print(f"[scalelab] warning: W&B online init failed ({type(exc).__name__}: {why}); the sweep summary is "
                  f"logged offline instead: sync later with `wandb sync {Path(sweep_dir) / 'wandb'}/offline-run-*`",
                  flush=True)
            # W&B's service keeps the failed run's id ("run ID ... is in use" when the offline run took
            # it too: no table, no report): a new service, and the offline summary is the same run (a new
            # id made a second summary run of the sweep once synced, and replaced the id in sweep.json)
            wandb.teardown()
            run = wandb.init(mode="offline", **kw)
    finally:
        sys.argv[:] = argv
    try:
        runs = wandb.Table(columns=RUN_COLUMNS, data=[_row(r) for r in sorted(records, key=sort_key)])
        eff = wandb.Table(columns=["kind", "strategy", "job", "world_size", "num_nodes", "global_batch_size",
                                   "samples_per_s", "scaling_efficiency", "baseline_job", "short_run"],
                          data=[[g["kind"], g["strategy"], m["job"], m["world_size"], m.get("num_nodes") or 1,
                                 m["global_batch_size"], m["samples_per_s"], m["scaling_efficiency"], g["baseline_job"],
                                 bool(m.get("short_run"))]
                                for g in summary["groups"] for m in g["runs"]])
        run.log({"sweep/runs": runs, "sweep/scaling_efficiency": eff, **charts(records, summary, cache_dir)})
        run.summary.update({"sweep/num_runs": summary["num_runs"], "sweep/num_completed": summary["num_completed"],
                            "sweep/num_failed": summary["num_failed"]})
        run.summary.update(efficiency_keys(summary["groups"]))
        return run.id
    finally:
        run.finish()


def efficiency_keys(groups: list[dict]) -> dict:
    """{efficiency/KIND/STRATEGY/xWORLD/bBATCH: efficiency}, xWORLDnNODES for a run on more than
    one node (one group holds 1 node x 2 devices and 2 nodes x 1 device, both x2: one key kept the
    last run's value); where two groups share a key (a sweep over models, seeds or micro-batch
    sizes at one strategy and batch), each names its baseline job too (/base=JOB): the last
    group's value overwrote the others'. Repeats at one world size in one group (runs that differ
    only in where their files go or how they were launched) each name their own job (/job=JOB)."""
    keyed = [(f"efficiency/{g['kind']}/{g['strategy']}/x{m['world_size']}{_nodes_tag(m)}/b{m['global_batch_size']}",
              g, m) for g in groups for m in g["runs"]]
    groups_of: dict[str, set] = {}
    for key, g, _ in keyed:
        groups_of.setdefault(key, set()).add(id(g))
    keyed = [((f"{key}/base={g['baseline_job']}" if len(groups_of[key]) > 1 else key), m) for key, g, m in keyed]
    count: dict[str, int] = {}
    for key, _ in keyed:
        count[key] = count.get(key, 0) + 1
    return {(f"{key}/job={m['job']}" if count[key] > 1 else key): m["scaling_efficiency"] for key, m in keyed}

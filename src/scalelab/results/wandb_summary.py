"""A sweep-summary W&B run: one table of the sweep's runs and their scaling efficiencies,
in the same W&B group as the sweep's job runs so dashboards compare them side by side."""
from __future__ import annotations

import os
from pathlib import Path

from scalelab.results.table import sort_key

RUN_COLUMNS = ["job", "strategy", "world_size", "global_batch_size", "per_device_batch_size",
               "accumulate_grad_batches", "lr", "samples_per_s", "tokens_per_s", "step_time_median_s",
               "step_time_p90_s", "peak_rss_bytes_max", "loss_final", "scaling_efficiency", "status", "error"]


def _row(r: dict) -> list:
    mem = r.get("memory", {}).get("peak_rss_bytes_per_rank") or [None]
    return [r.get("job", {}).get("name"), r.get("strategy"), r.get("world_size"), r.get("global_batch_size"),
            r.get("per_device_batch_size"), r.get("accumulate_grad_batches"), r.get("lr"),
            r.get("throughput", {}).get("samples_per_s"), r.get("throughput", {}).get("tokens_per_s"),
            r.get("step_time_s", {}).get("median"), r.get("step_time_s", {}).get("p90"),
            max((m for m in mem if m is not None), default=None), r.get("loss", {}).get("final"),
            r.get("scaling_efficiency"), r.get("status"), r.get("error")]


def log_sweep(sweep_dir: Path, summary: dict, records: list[dict], project: str, mode: str,
              entity: str | None = None, cache_dir: Path | None = None) -> str:
    """Log the summary run; returns its id. Offline runs land in SWEEP_DIR/wandb/."""
    import wandb

    if cache_dir is not None:
        for var, sub in (("WANDB_CACHE_DIR", "wandb-cache"), ("WANDB_CONFIG_DIR", "wandb-config"),
                         ("WANDB_DATA_DIR", "wandb-data")):
            os.environ.setdefault(var, str(Path(cache_dir) / sub))
    os.environ.setdefault("WANDB_SILENT", "true")
    run = wandb.init(project=project, entity=entity, mode=mode, dir=str(sweep_dir), group=Path(sweep_dir).name,
                     job_type="sweep_summary", name=f"{Path(sweep_dir).name}/summary",
                     config={"sweep_dir": str(sweep_dir), "num_runs": summary["num_runs"]}, reinit="create_new")
    try:
        runs = wandb.Table(columns=RUN_COLUMNS, data=[_row(r) for r in sorted(records, key=sort_key)])
        eff = wandb.Table(columns=["kind", "strategy", "job", "world_size", "global_batch_size", "samples_per_s",
                                   "scaling_efficiency", "baseline_job"],
                          data=[[g["kind"], g["strategy"], m["job"], m["world_size"], m["global_batch_size"],
                                 m["samples_per_s"], m["scaling_efficiency"], g["baseline_job"]]
                                for g in summary["groups"] for m in g["runs"]])
        run.log({"sweep/runs": runs, "sweep/scaling_efficiency": eff})
        run.summary.update({"sweep/num_runs": summary["num_runs"], "sweep/num_completed": summary["num_completed"],
                            "sweep/num_failed": summary["num_failed"]})
        for g in summary["groups"]:
            for m in g["runs"]:
                run.summary[f"efficiency/{g['kind']}/{g['strategy']}/x{m['world_size']}/b{m['global_batch_size']}"] = \
                    m["scaling_efficiency"]
        return run.id
    finally:
        run.finish()

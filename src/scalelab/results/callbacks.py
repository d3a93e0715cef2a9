"""Hydra callback: after a multirun, aggregate the sweep, log the W&B summary run and print
the comparison table."""
from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

from hydra.experimental.callback import Callback
from omegaconf import DictConfig

from scalelab.paths import REPORT_FILE, command
from scalelab.results.record import read_records
from scalelab.results.sweep import NO_RECORD_WHY, aggregate, attach_efficiency, summary_run_id
from scalelab.results.table import print_table


def cpu_note(records: list[dict]) -> str | None:
    """One line under a sweep's table where its runs put several ranks on one CPU host: a newcomer
    read `make run`'s efficiencies (0.6-0.9, 0.36 at batch 32, apart by 0.1 between two runs) as
    what the strategies do (README, Quick start)."""
    cpu = [r for r in records if ((r.get("hardware") or {}).get("accelerator")) == "cpu"
           and (r.get("devices_per_node") or r.get("world_size") or 1) > 1]
    if not cpu:
        return None
    return ("note: CPU ranks share one host's memory bus and caches, which no GPU cluster does: these figures "
            "show correctness and overhead, not the speed-up a strategy gets on GPUs (and vary from run to run)")


def headline(summary: dict) -> str:
    """'3 completed, 1 failed' and, where there are any, the records that could not be read and the
    job folders with none: every job of the sweep counted somewhere."""
    parts = [f"{summary['num_completed']} completed", f"{summary['num_failed']} failed"]
    if summary.get("num_skipped"):
        parts.append(f"{summary['num_skipped']} unreadable run.json")
    if summary.get("num_no_record"):
        parts.append(f"{summary['num_no_record']} without a record")
    return ", ".join(parts)


def summarize_sweep(sweep_dir: Path, logger_cfg: Any = None, cache_dir: str | None = None,
                    when_used: bool = False) -> dict:
    """Aggregate SWEEP_DIR (sweep.json), log to W&B when the logger is wandb, print the table (on
    a terminal the rich one, fitted to its width), write SWEEP_DIR/report.html and print its path.
    when_used: log to W&B only where a record's own logger was wandb (a multirun's base logger)."""
    summary = aggregate(sweep_dir)
    records = read_records([sweep_dir], [])   # its problems are the aggregation's (printed below, once)
    attach_efficiency(records, summary)
    if when_used and logger_cfg is not None:
        # the sweep's base logger is wandb, but `-m logger=none,csv` swept it away from every job:
        # a W&B summary run was still made for runs that logged nowhere (found by review)
        used = {((r.get("config") or {}).get("logger") or {}).get("name") for r in records}
        logger_cfg = logger_cfg if used & {"wandb", None} else None
    if logger_cfg is not None and logger_cfg.get("name") == "wandb" and logger_cfg.get("mode") != "disabled":
        from scalelab.results.wandb_summary import log_sweep

        # the summary run an earlier aggregation logged (aggregate kept its id in sweep.json) is resumed
        try:
            summary["wandb_run_id"] = log_sweep(sweep_dir, summary, records, logger_cfg.get("project", "scalelab"),
                                                logger_cfg.get("mode", "offline"), logger_cfg.get("entity"),
                                                Path(cache_dir) if cache_dir else None,
                                                run_id=summary_run_id(sweep_dir))
        except Exception as exc:  # noqa: BLE001 - W&B's failure costs its summary run, never the table or report
            why = (str(exc).strip().splitlines() or [""])[0][:200]
            print(f"[scalelab] warning: the sweep summary was not logged to W&B ({type(exc).__name__}: {why}); "
                  f"sweep.json, the table and report.html are written as usual", file=sys.stderr, flush=True)
        else:
            from scalelab.results.record import write_json

            write_json(sweep_dir / "sweep.json", summary)
    print(f"\n== sweep {sweep_dir}: {headline(summary)} ==")
    print_table(records)   # on a terminal the rich table `scalelab compare` prints, fitted to its width
    if note := cpu_note(records):
        print(note)
    for f in summary["failed"]:
        print(f"FAILED {f['job']} ({f['strategy']} x{f['world_size']}): {f['error']}")
    for line in summary["skipped"]:
        print(f"UNREADABLE {line}")
    for name in summary["no_record"]:
        print(f"NO RECORD {sweep_dir / name}: {NO_RECORD_WHY}")
    print(f"sweep summary: {sweep_dir / 'sweep.json'}")
    try:  # the dashboard is a view of the records: a failure to draw it never fails the sweep
        from scalelab.results.report import write_report

        report = write_report(sweep_dir / REPORT_FILE, records, [summary], cache=cache_dir)
        print(f"report: {report}")
    except Exception as exc:  # noqa: BLE001
        print(f"report: not written ({type(exc).__name__}: {exc})")
    print(f"compare: {command('scalelab')} compare {sweep_dir}  (--format markdown|csv|json|html; add other runs or "
          "sweeps)")
    return summary


# launcher=torchrun: the node ranks (never 0) of this command's jobs whose run record is on node 0
# (scalelab.train notes them): such a command's sweep has no figures of its own to aggregate.
OTHER_NODE: list[int] = []


class SweepSummary(Callback):
    def on_multirun_start(self, config: DictConfig, **kwargs: Any) -> None:
        if "optuna" in str(config.hydra.sweeper.get("_target_", "")).lower():
            # Optuna's own handler printed "A new study created in memory" with raw colour codes,
            # into files too; the sweeper's [HYDRA] lines already say the study, sampler and trials
            import optuna

            optuna.logging.set_verbosity(optuna.logging.WARNING)
            from scalelab.results import optuna_trials

            optuna_trials.install()   # a failed trial is one line and the search goes on

    def on_multirun_end(self, config: DictConfig, **kwargs: Any) -> None:
        sweep_dir = Path(config.hydra.sweep.dir)
        if OTHER_NODE:   # node 0 aggregates the sweep (sweep.json, table, report.html) from the records
            print(f"\n== sweep {sweep_dir}: node {OTHER_NODE[0]}'s part of {len(OTHER_NODE)} job(s) is done; "
                  "the records, sweep.json and report.html are written on node 0 ==")
            return
        from scalelab.job_dir import REFUSED

        if REFUSED:   # its folder holds another sweep's records: a summary would mix them in
            print(f"\n== sweep {sweep_dir}: not summarized: {len(REFUSED)} job(s) refused, their folders hold "
                  "another job's run ==")
            return
        if sweep_dir.exists() and any(sweep_dir.rglob("run.json")):
            summarize_sweep(sweep_dir, config.get("logger"), config.get("cache_dir"), when_used=True)

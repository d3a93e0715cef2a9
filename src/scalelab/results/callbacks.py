"""Hydra callback: after a multirun, aggregate the sweep and print its comparison table."""
from __future__ import annotations

from pathlib import Path
from typing import Any

from hydra.experimental.callback import Callback
from omegaconf import DictConfig

from scalelab.results.record import read_records
from scalelab.results.sweep import aggregate, attach_efficiency
from scalelab.results.table import render


class SweepSummary(Callback):
    def on_multirun_end(self, config: DictConfig, **kwargs: Any) -> None:
        sweep_dir = Path(config.hydra.sweep.dir)
        if not sweep_dir.exists():
            return
        summary = aggregate(sweep_dir)
        records = read_records([sweep_dir])
        attach_efficiency(records, summary)
        print(f"\n== sweep {sweep_dir}: {summary['num_completed']} completed, {summary['num_failed']} failed ==")
        print(render(records, "table"))
        print(f"sweep summary: {sweep_dir / 'sweep.json'}")

"""Failed trials of an Optuna search (`hydra/sweeper=optuna`, `experiment=lr_search`).

A failed job returns None (scalelab.train): hydra-optuna-sweeper 1.3 then tells Optuna the trial
FAILED and the search goes on. It returned NaN before, which Optuna 2.10's `tell` refuses and the
sweeper's fallback passed on again: one failed trial ended the whole search with a traceback, no
summary. What is left here is the sweeper's own wording: a warning per failed trial ("Return value
must be float-castable") and an error line about max_failure_rate that raises nothing (our
"[scalelab] job ... FAILED: why" line is the one to read), and a search whose every trial failed
ending in Optuna's "No trials are completed yet" traceback before the sweep's summary.
"""
from __future__ import annotations

import logging
import math

def objective(record: dict) -> float | None:
    """What a job returns to an optimizing sweeper (scalelab.train's and the SLURM launcher's): its
    final loss; None for a failed job or one with no finite final loss (a failed trial)."""
    final = (record.get("loss") or {}).get("final")
    ok = record.get("status") == "completed" and isinstance(final, (int, float)) and math.isfinite(final)
    return float(final) if ok else None


_SWEEPER_NOISE = ("Return value must be float-castable. Got 'None'", "with max_failure_rate=")


class _QuietFailedTrials(logging.Filter):
    def filter(self, record: logging.LogRecord) -> bool:
        return not any(n in record.getMessage() for n in _SWEEPER_NOISE)


def install() -> None:
    """Called before the sweeper's sweep (SweepSummary.on_multirun_start); idempotent."""
    from hydra_plugins.hydra_optuna_sweeper import _impl

    if getattr(_impl.OptunaSweeperImpl.sweep, "scalelab", False):
        return
    _impl.log.addFilter(_QuietFailedTrials())
    search = _impl.OptunaSweeperImpl.sweep

    def sweep(self, arguments):
        try:
            return search(self, arguments)
        except ValueError as e:   # study.best_trial: nothing to pick; the sweep's summary still runs
            if "No trials are completed yet" not in str(e):
                raise
            print("[scalelab] no trial of the search completed (each failed job's line above says why): no best "
                  "value", flush=True)

    sweep.scalelab = True
    _impl.OptunaSweeperImpl.sweep = sweep

"""How a job of `scalelab-train` ends, in lines (scalelab.train): a failed job's one FAILED line,
a sweep's job its one line, a single run its table, then where its record is and how to compare it;
and trainer.timeout_s, the whole job's limit, which a timed-out job's error names; the line of a
job Ctrl-C or SIGTERM stopped."""
from __future__ import annotations

import logging
import math
from pathlib import Path

from omegaconf import DictConfig

from scalelab.checkpointing import find_resume, resume_point
from scalelab.paths import command
from scalelab.job_outcome import one_line
from scalelab.results.record import RUN_FILE

log = logging.getLogger("scalelab")


def report_end(record: dict, name: str, job_dir: Path, multirun: bool, failed: list[str]) -> None:
    """A job's end, on the console and in its train.log (Hydra's job logging): a failed job's one
    FAILED line (it was followed by "[scalelab] JOB: failed"), listed in FAILED (the command's
    failed jobs); a sweep's job its one line (the sweep prints its table at the end); a single run
    its table and where its record is (its folder was in the job's first line, scrolled away by then)."""
    from scalelab.results.table import print_table

    if record["status"] != "completed":
        failed.append(f"{name}: {record.get('error')}")
        log.error(f"[scalelab] job {name} FAILED: {record.get('error')}")
    if multirun or record.get("record_on_node") is not None:
        if record["status"] == "completed":
            log.info(one_line(record))
        return
    print_table([record], log)   # a terminal gets the fitted rich table; train.log and pipes the plain text
    log.info(results_line(job_dir))


def results_line(job_dir: Path) -> str:
    """The last line of a single run: where its record is, and how to compare it with others."""
    return f"results: {job_dir / RUN_FILE}  (compare: {command('scalelab')} compare {job_dir} OTHER_RUN_OR_SWEEP ...)"


def timed_out(cfg: DictConfig) -> str:
    """A job's error where trainer.timeout_s ended it: the limit it ran into ("timed out
    (trainer.timeout_s)" left the user to look the value up)."""
    return f"timed out after trainer.timeout_s={job_timeout(cfg):g} s"


def job_timeout(cfg: DictConfig) -> float:
    """trainer.timeout_s, the whole job's limit (launch to exit); null (the default): none. A hung
    peer is bounded by trainer.collective_timeout_s and a SLURM job by its --time; a fixed default
    here (1800 s, until found by review) killed every longer run, SLURM jobs with hours of --time too."""
    t = cfg.trainer.get("timeout_s")
    return math.inf if t is None else float(t)


def interrupted_line(job_dir: Path | None, sweep_dir: Path | None = None, signame: str = "Ctrl-C",
                     run_dir: Path | None = None, max_steps: int | None = None, every: int | None = None,
                     finished: Path | None = None) -> str:
    """One line for Ctrl-C (or SIGTERM): which job it stopped and how to go on (checkpoint.resume=auto
    resumes from the job's newest checkpoint when the same command runs again into the same folder,
    run_dir: Hydra's, where node K of a torchrun job keeps its files in JOB_DIR/nodeK). finished:
    the last job that ended, where none runs now (between a sweep's jobs, in its summary)."""
    if job_dir is None and finished is not None:
        if sweep_dir:
            return (f"[scalelab] interrupted ({signame}) between jobs, after {finished} ended: no job was running; "
                    f"the same command with hydra.sweep.dir={sweep_dir} keeps the jobs that completed, runs the "
                    f"others and writes the sweep's summary{_under_make('hydra.sweep.dir', sweep_dir)}")
        return f"[scalelab] interrupted ({signame}) after the run ended: its record is {finished / 'run.json'}"
    if job_dir is None:
        return f"[scalelab] interrupted ({signame}) before any job started"
    # where checkpoint.resume=auto goes on from (the one before a checkpoint at max_steps, to redo its interval)
    saved = resume_point(job_dir, max_steps)[0] if max_steps else find_resume(job_dir)[0]
    again = (f"hydra.sweep.dir={sweep_dir} (its completed jobs are kept; this one resumes)" if sweep_dir
             else f"hydra.run.dir={run_dir or job_dir}")
    if saved:
        how = f"the same command with {again} goes on from its checkpoint {saved.name}"
        how += _under_make("hydra.sweep.dir" if sweep_dir else "hydra.run.dir", sweep_dir or run_dir or job_dir)
    elif every:   # stopped before its first save
        how = f"it saved no checkpoint yet (checkpoint.every_n_steps={every})"
    else:
        how = "it saved no checkpoint (checkpoint.every_n_steps=N saves one every N steps)"
    if not saved and sweep_dir:   # what a rerun still keeps: the default folder is new each time
        how += (f"; the same command with hydra.sweep.dir={sweep_dir} keeps the jobs that completed"
                + _under_make("hydra.sweep.dir", sweep_dir))
    return f"[scalelab] interrupted ({signame}) in {job_dir}: {how}"


def _under_make(key: str, value) -> str:
    """': CMD', the command itself, where `make run` started this one: 'the same command' is then
    make's, which takes no hydra.sweep.dir (found by a newcomer's walkthrough); else ''."""
    import os
    import shlex
    import sys

    if not os.environ.get("MAKELEVEL") or not Path(sys.argv[0]).name.startswith("scalelab-train"):
        return ""
    args = [a for a in sys.argv[1:] if a.split("=", 1)[0].lstrip("+") != key]
    return ": " + " ".join([command("scalelab-train"), *map(shlex.quote, args), shlex.quote(f"{key}={value}")])

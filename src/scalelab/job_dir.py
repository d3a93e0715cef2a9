"""Whose run a job's folder holds before the job runs in it.

The same command run again into the same folder (hydra.run.dir / hydra.sweep.dir given, after a
crash, a Ctrl-C or a requeue) finds its own earlier run: with checkpoint.resume=auto a completed
record is kept (nothing runs: a rerun sweep finishes the jobs it had not finished instead of
training the finished ones again) and an unfinished one resumes from its checkpoints. A folder
that holds ANOTHER job's run (a sweep dir reused by a different sweep, whose job numbers now
name other configs; a run dir given other values) is refused before anything is written there:
the job would have replaced that run's record and resumed its checkpoints as its own, training
on from weights of another config. Which job ran there is read from its config_resolved.yaml
(the overrides it ran with, as Hydra passed them).
"""
from __future__ import annotations

from pathlib import Path

from scalelab.same_job import NODE_OWN, difference

CONFIG_FILE = "config_resolved.yaml"  # JOB_DIR/config_resolved.yaml: the resolved config the ranks read
# Keys free to differ between two runs of the same job: where it writes and how it logs, its host
# resources (same_job.NODE_OWN), how it checkpoints and restarts (not what it trains), and how long
# it trains (the same run continued to a larger trainer.max_steps: "train it longer").
FREE = (*NODE_OWN, "checkpoint.", "trainer.max_restarts", "trainer.max_steps")


def _key_values(overrides) -> dict[str, str]:
    out = {}
    for o in overrides or []:
        key, _, value = str(o).partition("=")
        name = key.lstrip("+")
        if not name.lstrip("~").startswith(FREE):
            out[name] = value
    return out


def earlier_overrides(job_dir: Path) -> list[str] | None:
    """The overrides of the run that used job_dir before (its config_resolved.yaml), or None."""
    import yaml

    try:
        job = (yaml.safe_load((Path(job_dir) / CONFIG_FILE).read_text()) or {}).get("job") or {}
    except (OSError, yaml.YAMLError, AttributeError):
        return None
    overrides = job.get("overrides") if isinstance(job, dict) else None
    return [str(o) for o in overrides] if isinstance(overrides, list) else None


def same_job(a, b) -> bool:
    """Whether two override lists run the same job (the FREE keys apart, in any order)."""
    return _key_values(a) == _key_values(b)


def refusal(job_dir: Path, overrides: list[str]) -> str | None:
    """One line when job_dir holds another job's run that this job would overwrite (a record of
    it, or checkpoints), else None. An earlier run of the same job, or one that left nothing but
    its logs (it failed before any checkpoint), is no reason to refuse."""
    job_dir = Path(job_dir)
    earlier = earlier_overrides(job_dir)
    if earlier is None or same_job(earlier, overrides):
        return None
    left = [name for name in ("run.json", "checkpoints") if (job_dir / name).exists()]
    if not left:
        return None
    diff = difference(_key_values(earlier), _key_values(overrides))
    return (f"{job_dir} holds another job's run ({' and '.join(left)}; there vs now: {'; '.join(diff)[:300]}): this "
            "job would replace its record and resume its checkpoints; give this run a new folder (hydra.run.dir "
            "or hydra.sweep.dir; checkpoint.resume_from=PATH continues a checkpoint of it there)")


def completed_here(record: dict | None, overrides: list[str], max_steps: int) -> bool:
    """Whether `record` (the job dir's run.json) is a completed run of this same job to the same
    trainer.max_steps: the launcher's final record (its `ranks_exited` mark), not rank 0's part of
    a job killed after."""
    if not record or record.get("status") != "completed":
        return False
    final = bool(((record.get("timing") or {}).get("marks") or {}).get("ranks_exited"))
    steps = ((record.get("config") or {}).get("trainer") or {}).get("max_steps")
    return final and steps == max_steps and same_job((record.get("job") or {}).get("overrides"), overrides)

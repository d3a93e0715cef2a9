"""Whose run a job's folder holds before the job runs in it.

The same command run again into the same folder (hydra.run.dir / hydra.sweep.dir given, after a
crash, a Ctrl-C or a requeue) finds its own earlier run: with checkpoint.resume=auto a completed
record is kept (nothing runs: a rerun sweep finishes the jobs it had not finished instead of
training the finished ones again) and an unfinished one resumes from its checkpoints. A folder
that holds ANOTHER job's run (a sweep dir reused by a different sweep, whose job numbers now
name other configs; a run dir given other values) is refused before the job writes anything
there: it would have replaced that run's record and resumed its checkpoints as its own, training
on from weights of another config.

"The same job" is the same resolved config (JOB_DIR/config_resolved.yaml, a record's `config`),
not the same override strings: `optim.lr=0.1` and `optim.lr=1e-1` are one job, and an
experiment or candidate file edited since (the same overrides, other values) is another.
"""
from __future__ import annotations

from pathlib import Path
from typing import Any

from scalelab.paths import CONFIG_FILE, RUN_MARKS, SWEEP_MARKS
from scalelab.same_job import NODE_OWN

# The folders this command's jobs were refused in (train.run_job): the sweep is not summarized then,
# since its folder holds another sweep's records (results.callbacks.SweepSummary).
REFUSED: list[str] = []
# Keys free to differ between two runs of the same job: where it writes and how it logs, its host
# resources (same_job.NODE_OWN), how it checkpoints and restarts (not what it trains), and how long
# it trains (the same run continued to a larger trainer.max_steps: "train it longer").
FREE = (*NODE_OWN, "job", "checkpoint.", "trainer.max_restarts", "trainer.max_steps")


# What a run measures, not what it trains: free between a run and its continuation to another
# trainer.max_steps, whose attempt measures its own steps (a 5-step run's warm-up, lowered to 4 by
# config.smoke_warmup, refused the same job continued to 10 steps: 'trainer.warmup_steps: 4 vs 5')
MEASURED = ("trainer.warmup_steps", "trainer.profile_steps")


def _job_values(cfg: dict, keep_free: tuple[str, ...] = (), also_free: tuple[str, ...] = ()) -> dict[str, Any]:
    """The config's values that make the job (dotted keys), secrets redacted as saved."""
    from scalelab.results.record import scrub
    from scalelab.results.table import flatten

    free = FREE + also_free
    return {k: v for k, v in flatten(scrub(cfg)).items() if not k.startswith(free) or k in keep_free}


def earlier_config(job_dir: Path) -> dict | None:
    """The resolved config of the run that used job_dir before (its config_resolved.yaml), or None."""
    import yaml

    try:
        cfg = yaml.safe_load((Path(job_dir) / CONFIG_FILE).read_text())
    except (OSError, yaml.YAMLError):
        return None
    return cfg if isinstance(cfg, dict) else None


def differences(a: dict, b: dict, keep_free: tuple[str, ...] = (), also_free: tuple[str, ...] = ()) -> list[str]:
    """`KEY: A vs B` for every job value that differs (`-` where one config has no such key); a
    config group chosen differently (strategy=single vs ddp) is one entry, not each of its keys."""
    va, vb = _job_values(a, keep_free, also_free), _job_values(b, keep_free, also_free)
    out, groups = [], set()
    for k in sorted(set(va) | set(vb)):
        if va.get(k) == vb.get(k) or k.split(".", 1)[0] in groups:
            continue
        group = k.split(".", 1)[0]
        na, nb = va.get(f"{group}.name"), vb.get(f"{group}.name")
        if "." in k and na != nb:    # another choice of the group: its name says it
            groups.add(group)
            out.append(f"{group}: {na or '-'} vs {nb or '-'}")
        else:
            out.append(f"{k}: {va.get(k, '-')} vs {vb.get(k, '-')}")
    return out


def refusal(job_dir: Path, cfg: dict) -> str | None:
    """One line when job_dir holds another job's run that this job (resolved config `cfg`) would
    overwrite (a record of it, or checkpoints), else None. An earlier run of the same job, or one
    that left nothing but its logs (it failed before any checkpoint), is no reason to refuse."""
    job_dir = Path(job_dir)
    earlier = earlier_config(job_dir)
    if earlier is None:
        return _other_checkpoints(job_dir, cfg)
    left = [name for name in ("run.json", "checkpoints") if (job_dir / name).exists()]
    was, now = _lengths(earlier, cfg)
    diff = differences(earlier, cfg, also_free=MEASURED if was != now else ()) if left else []
    if not diff:
        return _shorter(job_dir, earlier, cfg) or _longer(job_dir, earlier, cfg)
    return (f"{job_dir} holds another job's run ({' and '.join(left)}; there vs now: {'; '.join(diff)[:300]}): this "
            "job would replace its record and resume its checkpoints; give this run a new folder (hydra.run.dir "
            "or hydra.sweep.dir; scalelab k8s: a new --name; checkpoint.resume_from=PATH continues a checkpoint "
            "of it there)")


def _other_checkpoints(job_dir: Path, cfg: dict) -> str | None:
    """A folder without a config_resolved.yaml (checkpoints/ copied into a new hydra.run.dir) whose
    checkpoint checkpoint.resume=auto would load was saved by another kind of run (the config it
    carries, as checkpoint.resume_from is checked): one line. Every rank crashed on it loading
    (a KeyError in the optimizer's state, a size mismatch), after the resume line."""
    from scalelab.checkpointing import resume_point
    from scalelab.resume_checks import resume_mismatch

    max_steps = (cfg.get("trainer") or {}).get("max_steps")
    if (cfg.get("checkpoint") or {}).get("resume", "auto") != "auto" or not isinstance(max_steps, int) \
            or not (job_dir / "checkpoints").is_dir():
        return None
    path = resume_point(job_dir, max_steps)[0]
    differs = path is not None and path.exists() and resume_mismatch(path, cfg)
    if not differs:
        return None
    return (f"{job_dir} holds a checkpoint of another kind of run ({path.name}: {differs}), which "
            "checkpoint.resume=auto would resume: give this run a new folder (hydra.run.dir or hydra.sweep.dir), "
            "or resume it with the same kind of strategy (ZeRO: stage, world size and gradient clip), model shape "
            "and optimizer")


def kind_refusal(folder: Path, multirun: bool) -> str | None:
    """One line when `folder`, given as a single run's hydra.run.dir, is a sweep's (a run there
    wrote its run.json beside the sweep's jobs, and `scalelab aggregate` then refused the sweep),
    or, given as a sweep's hydra.sweep.dir, is a single run's (the jobs, multirun.yaml and
    sweep.json landed inside that run); else None."""
    folder = Path(folder)
    if not folder.is_dir():
        return None
    if multirun:
        held = [name for name in RUN_MARKS if (folder / name).is_file()]
        return (f"hydra.sweep.dir={folder} is a single run's folder (it holds {' and '.join(held)}): a sweep there "
                "would mix its jobs and sweep.json into that run; give the sweep a folder of its own"
                if held else None)
    held = [name for name in SWEEP_MARKS if (folder / name).is_file()]
    jobs = sorted(p.parent.name for p in folder.glob("*/run.json"))
    if jobs:
        held.append(f"job records {', '.join(jobs[:3])}{', ...' if len(jobs) > 3 else ''}/run.json")
    held = ", ".join(held[:-1]) + (" and " if len(held) > 1 else "") + held[-1] if held else ""
    return (f"hydra.run.dir={folder} is a sweep's folder (it holds {held}): a single run there would "
            "write its run.json among the sweep's jobs; give the run a folder of its own (the sweep runs again "
            f"with -m hydra.sweep.dir={folder})" if held else None)


def _lengths(earlier: dict, cfg: dict) -> tuple[int | None, int | None]:
    """(trainer.max_steps of the earlier run, of this one); None where one is not an integer."""
    was, now = ((c.get("trainer") or {}).get("max_steps") for c in (earlier, cfg))
    return (was, now) if isinstance(was, int) and isinstance(now, int) else (None, None)


def _record_here(job_dir: Path) -> dict:
    """The folder's run.json as it is ({} where there is none, or it is not a JSON object)."""
    import json

    try:
        record = json.loads((job_dir / "run.json").read_text())
    except (OSError, ValueError):
        return {}
    return record if isinstance(record, dict) else {}


def completed_run(record: dict | None) -> bool:
    """Whether the folder's record is a completed run to lose by replacing it: a node's own record
    (launcher=torchrun, node >= 1: record_on_node) is none, node 0 decides."""
    return bool(record) and record.get("status") == "completed" and record.get("record_on_node") is None


def _shorter(job_dir: Path, earlier: dict, cfg: dict) -> str | None:
    """One line when this job, run again with a smaller trainer.max_steps, would replace a longer
    completed run's record or lose its checkpoints past the new last step (they would also be
    the newest, so keep_last would prune the new run's own)."""
    from scalelab.checkpointing import valid_checkpoints

    was, now = _lengths(earlier, cfg)
    if was is None or now >= was:
        return None
    done = _record_here(job_dir).get("status") == "completed"
    beyond = [step for step, _ in valid_checkpoints(job_dir / "checkpoints")[0] if step > now]
    if not done and not beyond:
        return None
    what = " and ".join((["its completed record"] if done else [])
                        + ([f"checkpoints to step {max(beyond)}"] if beyond else []))
    return (f"{job_dir} holds a longer run of this job (trainer.max_steps={was}: {what}): trainer.max_steps={now} "
            "would replace it; a shorter run needs a folder of its own (hydra.run.dir or hydra.sweep.dir)")


def _longer(job_dir: Path, earlier: dict, cfg: dict) -> str | None:
    """One line when this job, run again with a larger trainer.max_steps to train it longer, has no
    checkpoint to go on from: it would start over from step 0 and replace the completed record
    (silently, before). checkpoint.resume=never says to start over."""
    from scalelab.checkpointing import valid_checkpoints

    was, now = _lengths(earlier, cfg)
    if was is None or now <= was:
        return None
    ckpt = cfg.get("checkpoint") or {}
    # resume=never starts over on purpose; resume_from goes on from the checkpoint it names
    if ckpt.get("resume", "auto") == "never" or ckpt.get("resume_from") or valid_checkpoints(job_dir / "checkpoints")[0]:
        return None
    if not completed_run(_record_here(job_dir)):
        return None
    last = job_dir / "checkpoints" / "last.ckpt"   # checkpoint.save=true's, which resume=auto does not read
    go_on = (f", or checkpoint.resume_from={last} to go on from its last step" if last.exists() else "")
    return (f"{job_dir} holds a completed run of this job to trainer.max_steps={was} and no checkpoint to go on "
            f"from (checkpoint.every_n_steps=N saves them): trainer.max_steps={now} would train it again from "
            "step 0 and replace its record; give the longer run a folder of its own (hydra.run.dir or "
            f"hydra.sweep.dir), or add checkpoint.resume=never to replace it{go_on}")


def completed_here(record: dict | None, cfg: dict) -> bool:
    """Whether `record` (the job dir's run.json) is a completed run of this same job (resolved
    config `cfg`) to the same trainer.max_steps: the launcher's final record (its `ranks_exited`
    mark), not rank 0's part of a job killed after."""
    from scalelab.results.record import completed_final

    if not completed_final(record) or not isinstance(record.get("config"), dict):
        return False
    return not differences(record["config"], cfg, keep_free=("trainer.max_steps",))

"""Periodic checkpoints that a crash cannot half-write, and finding the one to resume from.

Layout: JOB_DIR/checkpoints/step-00000010.ckpt (a file or, for sharded strategies, a folder: the
strategy's own format via trainer.save_checkpoint) and step-00000010.ckpt.manifest.json beside it.
A save goes to a `.tmp` name first; after every rank has written its part (barrier), rank 0
records each file's size in the manifest and renames the checkpoint to its final name, so a
checkpoint with a final name and a manifest was complete when written. Validation before a
resume re-checks the sizes: a checkpoint truncated or partly deleted since is reported and the
one before it used; the launcher also reads the file checkpoints a resume could take once (their
zip members' CRCs) and sets one damaged at its full size aside (set_aside_damaged). The last `keep_last` checkpoints are kept;
`.tmp` saves a killed run left behind are removed when training starts.

Beside each checkpoint, every rank writes its loss curve so far (step-N.ckpt.curve-rank{R}.json):
a resumed run's record then holds the whole run's curve (the mean over ranks, as always), not
only this attempt's steps (a SLURM requeue's first attempt writes no record of its own).
"""
from __future__ import annotations

import json
import os
import re
import shutil
import time
import zipfile
from pathlib import Path
from typing import Any

_NAME = re.compile(r"^step-(\d{8})\.ckpt$")
_TMP = re.compile(r"^step-\d{8}\.ckpt(\.manifest)?\.tmp$")   # a save (or its manifest) not renamed yet
_CURVE = re.compile(r"^(step-\d{8}\.ckpt|last\.ckpt)\.curve-rank\d+\.json$")   # curve_path's names
MANIFEST = ".manifest.json"
PROGRESS = ".progress"  # JOB_DIR/.progress: the last optimizer step rank 0 finished (restarts count steps redone)
SAVE_MARK = "scalelab::checkpoint_save"  # the profiler's name for a periodic save (its barriers are no step's comm)
RESUMED = ".resumed"    # JOB_DIR/.resumed: the step this attempt resumed at (rank 0 writes it at start)
# JOB_DIR/.restarts.json: {"restarts", "steps_redone"} so far, under torchrun (its agent restarts the
# ranks, not scalelab: rank 0 of each restarted attempt adds its own, note_restart)
RESTARTS = ".restarts.json"


def _files(path: Path) -> dict[str, int]:
    if path.is_file():
        return {"": path.stat().st_size}
    return {str(p.relative_to(path)): p.stat().st_size for p in sorted(path.rglob("*")) if p.is_file()}


def valid_checkpoints(ckpt_dir: Path) -> tuple[list[tuple[int, Path]], list[str]]:
    """([(step, path)] newest first, [problem lines]) for the complete, unchanged checkpoints."""
    good, problems = [], []
    if not ckpt_dir.is_dir():
        return good, problems
    for p in sorted(ckpt_dir.iterdir(), reverse=True):
        m = _NAME.match(p.name)
        if not m:
            continue
        if _manifest(p).get("files") is None:
            problems.append(f"{p}: no manifest (a save that did not finish)")
            continue
        bad = size_problem(p)
        if bad:
            problems.append(bad)
            continue
        good.append((int(m.group(1)), p))
    return good, problems


def size_problem(path: Path) -> str | None:
    """'PATH is truncated or partial (...)' where its files' sizes are not those its manifest
    (NAME.manifest.json beside it) recorded when it was saved; None where they are, or where it
    has no manifest (saved elsewhere: not judged)."""
    want = _manifest(path).get("files")
    if want is None:
        return None
    have = _files(path)
    bad = [f"{name or path.name}: {have.get(name, 'missing')} of {size} bytes" for name, size in want.items()
           if have.get(name) != size]
    return f"{path} is truncated or partial ({'; '.join(bad[:3])})" if bad else None


def find_resume(job_dir: Path, below: int | None = None, slurm_job: str | None = None
                ) -> tuple[Path | None, int, list[str]]:
    """The newest valid checkpoint of this job dir (before step `below`, saved by SLURM job
    `slurm_job`, if given): (path, step, problems); (None, 0, ...) if none. Reads no checkpoint
    (the launcher set damaged ones aside before the ranks started: set_aside_damaged)."""
    good, problems = valid_checkpoints(job_dir / "checkpoints")
    good = [g for g in good if (below is None or g[0] < below)
            and (slurm_job is None or _manifest(g[1]).get("slurm_job") == slurm_job)]
    if good:
        return good[0][1], good[0][0], problems
    return None, 0, problems


DAMAGED = ".damaged"   # step-N.ckpt.damaged: set aside (no longer a checkpoint's name), kept to look at


def set_aside_damaged(job_dir: Path, max_steps: int, slurm_job: str | None = None) -> list[str]:
    """The launcher, once per job before its ranks start (checkpoint.resume=auto): reads the
    checkpoint file the ranks' resume_point would load (the same max_steps and SLURM job) and, while
    it is damaged (see damaged), renames it NAME.damaged and takes the next one, so that every rank
    passes it over alike; returns a line for each. One read of one file (not one per rank, each
    deciding alone). Before, a file damaged at its full size (sizes agree with the manifest)
    crashed every rank in torch.load, in every requeue or restart after."""
    lines, tried = [], set()
    while True:
        path = resume_point(job_dir, max_steps, slurm_job)[0]
        if path is None or path in tried:   # (a path that stays chosen: a dangling link)
            return lines
        tried.add(path)
        bad = damaged(path)
        if bad is None:
            if path.exists():
                return lines
            continue          # another node's launcher set it aside meanwhile (a shared folder)
        aside = path.with_name(path.name + DAMAGED)
        try:
            os.replace(path, aside)
        except FileNotFoundError:
            continue
        except OSError as e:   # a read-only folder: every rank would crash loading it, after the queue wait
            if not path.exists():   # another node's launcher set it aside meanwhile
                continue
            from scalelab.errors import ConfigError
            raise ConfigError(f"checkpoint {bad}, and it cannot be set aside as {aside.name} ({e.strerror or e}): "
                              f"{path.parent} must be writable (the job's saves need it too)") from None
        lines.append(f"checkpoint {bad}: set aside as {aside.name}, not used")


def damaged(path: Path) -> str | None:
    """Why checkpoint file `path` (torch.save's zip archive, as Lightning's .ckpt) cannot be loaded
    right although its size is right, else None: its index as torch.load's reader reads it, then
    every member against its CRC-32 (read whole once; torch.load does not check CRCs: a flipped
    byte in a tensor loads as another weight). None (not judged) for a sharded checkpoint's folder,
    a file that is no zip archive at either end (another format: torch.load judges it), a CRC
    Python's zipfile cannot check (an index only torch's reader reads; saved without CRCs,
    torch.serialization.set_crc32_options(False), zero in every member), and a read that failed
    (OSError: a file system's hiccup is no damage to set aside for)."""
    path = Path(path)
    if not path.is_file():
        return None
    import torch

    try:
        with open(path, "rb") as f:
            zip_head = f.read(4) == b"PK\x03\x04"
        if not zip_head and not zipfile.is_zipfile(path):
            return None
        with open(path, "rb") as f:   # read through Python: a failed read is an OSError, not torch's RuntimeError
            torch._C.PyTorchFileReader(f).get_all_records()
    except OSError:
        return None
    except Exception as e:  # noqa: BLE001 - what torch.load's reader refuses, in its words
        return f"{path} is damaged (not a readable zip archive: {str(e).splitlines()[0][:160]})"
    try:
        with zipfile.ZipFile(path) as z:
            if any(i.CRC == 0 and i.file_size for i in z.infolist()):
                return None
            member = z.testzip()
    except Exception:  # noqa: BLE001 - zipfile stricter than torch's reader here: not judged
        return None
    return f"{path} is damaged (its member {member} fails its CRC check)" if member else None


def resume_point(job_dir: Path, max_steps: int, slurm_job: str | None = None
                 ) -> tuple[Path | None, int, list[str], bool]:
    """checkpoint.resume=auto's choice in a job folder: (path, step, problems, passed_last). The
    newest valid checkpoint; where that one is at max_steps (the last step is saved but the
    record is not: the job was cut between the two, or SLURM requeued it after its last step;
    train.run_job keeps a completed record before any rank starts), the one before it, of SLURM
    job `slurm_job` if given, so that the attempt redoes one interval and has steps to measure
    (passed_last: True); (None, 0, ...) where there is none."""
    path, step, problems = find_resume(job_dir)
    if path is None or step < max_steps:
        return path, step, problems, False
    path, step, problems = find_resume(job_dir, below=max_steps, slurm_job=slurm_job)
    return path, step, problems, True


def goes_on_from(job_dir: Path, max_steps: int, auto: bool = True, start: str | None = None) -> str:
    """Where ranks started again in job_dir go on from (the worker's choice: resume_point, else
    checkpoint.resume_from), as the restart line says it."""
    path, step, _, _ = resume_point(job_dir, max_steps) if auto else (None, 0, [], False)
    if path is not None:
        return f"resume from step {step}"
    if start:
        return f"start from checkpoint.resume_from {start}"
    return "start over from step 0" + (" (no checkpoint yet: checkpoint.every_n_steps=N saves one every N steps)"
                                       if auto else " (checkpoint.resume=never)")


def checkpoint_step(ckpt: Path) -> int | None:
    """The optimizer step a checkpoint was saved at: its manifest's, else its name's
    (step-00000060.ckpt), else its own entries' (a copy renamed, without its manifest); None when
    none says."""
    from scalelab.checkpoint_config import saved_step

    step = _manifest(Path(ckpt)).get("step")
    if isinstance(step, int):
        return step
    m = _NAME.match(Path(ckpt).name)
    return int(m.group(1)) if m else saved_step(ckpt)


def saved_by(ckpt: Path) -> dict | None:
    """The resolved config of the run that saved `ckpt`: the one it carries (checkpoint_config),
    else JOB_DIR/config_resolved.yaml beside its checkpoints/ folder (a checkpoint saved before
    they carried it); None for one saved outside scalelab, or an older one copied elsewhere."""
    from scalelab.checkpoint_config import saved_config
    from scalelab.job_dir import earlier_config

    ckpt = Path(ckpt)
    own = saved_config(ckpt)
    if own is not None:
        return own
    return earlier_config(ckpt.parent.parent) if ckpt.parent.name == "checkpoints" else None


def read_mark(path: Path, default: int | None = None) -> int | None:
    """The step a mark file holds (PROGRESS, RESUMED), or `default` where there is none."""
    try:
        return int(path.read_text().strip())
    except (OSError, ValueError):
        return default


def note_restart(job_dir: Path, restart: int, resumed_at: int | None) -> dict:
    """Rank 0 of an attempt that torchrun started again (TORCHELASTIC_RESTART_COUNT = `restart`
    > 0), before its first step: adds the steps the failed attempt did past this attempt's resume
    point (its JOB_DIR/.progress, noted every step when trainer.max_restarts > 0) to
    JOB_DIR/.restarts.json, and sets .progress to the resume point (an attempt that fails before
    its first step redid nothing). Returns {"restarts", "steps_redone"}, as spawn.run_job counts
    them for launcher=local; once per attempt."""
    done = read_restarts(job_dir)
    if restart > done["restarts"]:
        failed_at = read_mark(job_dir / PROGRESS, 0)
        done = {"restarts": int(restart), "steps_redone": done["steps_redone"] + max(0, failed_at - (resumed_at or 0))}
        tmp = job_dir / (RESTARTS + ".tmp")
        tmp.write_text(json.dumps(done))
        os.replace(tmp, job_dir / RESTARTS)
        (job_dir / PROGRESS).write_text(str(resumed_at or 0))
    return done


def read_restarts(job_dir: Path) -> dict:
    """{"restarts", "steps_redone"} noted by note_restart ({0, 0} where none was)."""
    try:
        done = json.loads((job_dir / RESTARTS).read_text())
        return {"restarts": int(done["restarts"]), "steps_redone": int(done["steps_redone"])}
    except (OSError, ValueError, KeyError, TypeError):
        return {"restarts": 0, "steps_redone": 0}


def write_step(ckpt: Path, step: int) -> None:
    """A manifest with only the step, for a checkpoint saved outside the periodic callback
    (checkpoint.save's last.ckpt): checkpoint.resume_from can then be checked before any rank."""
    ckpt.with_name(ckpt.name + MANIFEST).write_text(json.dumps({"step": int(step)}))


def _manifest(ckpt: Path) -> dict:
    try:
        return json.loads(ckpt.with_name(ckpt.name + MANIFEST).read_text())
    except (OSError, ValueError):
        return {}


def periodic_checkpoint(job_dir: Path, every: int | None, keep: int, note_progress: bool = True):
    """The Lightning callback (built here so that the launcher can use this module's functions
    without importing Lightning)."""
    import lightning as L

    class _Periodic(PeriodicCheckpoint, L.Callback):
        pass

    return _Periodic(job_dir, every, keep, note_progress)


class PeriodicCheckpoint:
    """Saves every `every` optimizer steps (collective: every rank calls trainer.save_checkpoint),
    atomically, keeping the newest `keep` checkpoints; rank 0 also notes the finished step in
    JOB_DIR/.progress (every step with `note_progress`, else at most once a second, and at the end)."""

    #: seconds between .progress writes when not every step is needed
    PROGRESS_EVERY_S = 1.0

    def __init__(self, job_dir: Path, every: int | None, keep: int, note_progress: bool = True):
        self.job_dir, self.every, self.keep = Path(job_dir), every, max(1, keep)
        self.curve_of = None   # () -> {"global_steps", "losses"} of this rank so far (StepMetrics.curve_so_far)
        # (trainer) -> None, after each periodic save: the step clock starts again there, or the
        # step after a save is timed with it (StepMetrics.restart_clock)
        self.after_save = None
        self.save_s: list[float] = []   # each periodic save's seconds on this rank (run.json timing)
        # JOB_DIR/.progress: exact per step where an elastic restart counts the steps it redoes
        # (spawn.run_job, trainer.max_restarts > 0); otherwise a live progress mark (monitoring,
        # the SLURM tests) written at most once a second: a file write per step is 0.04 ms on
        # tmpfs and 0.4-3.5 ms of host time on this VM's disk under load
        # (benchmarks/host_overhead.py), more on a shared file system
        self.note_progress = note_progress
        self._noted_at = float("-inf")
        self._last = -1              # the step saved last (or resumed at)
        self._saved: set[int] = set()  # the steps this callback saved in this attempt
        self.dir = self.job_dir / "checkpoints"

    def _note(self, trainer, force: bool = False) -> None:
        if not trainer.is_global_zero:
            return
        now = time.monotonic()
        if force or self.note_progress or now - self._noted_at >= self.PROGRESS_EVERY_S:
            (self.job_dir / PROGRESS).write_text(str(trainer.global_step))
            self._noted_at = now

    def on_exception(self, trainer, pl_module, exception) -> None:
        # a failed job's record says how far it got from this mark: the steps of the last second
        # before a crash or a hung peer's timeout were missing (steps 1 where rank 0 had done 2).
        # Only once training ran (a failure while a resume loads its checkpoint is at step 0 here,
        # and the mark then says where it resumed), and never in the way of the error itself
        if getattr(self, "_trained", False):
            try:
                self._note(trainer, force=True)
            except OSError:
                pass

    def on_train_start(self, trainer, pl_module) -> None:
        self._trained = True
        # a resumed run starts at its checkpoint's step: with accumulation, the first micro-batches
        # after it still report that step and must not save it again, mid-step (a later resume
        # then ran one micro-batch off)
        self._last = trainer.global_step
        if trainer.is_global_zero:   # no save of this attempt is under way yet: the first waits for rank 0
            self.remove_stale()
        if trainer.is_global_zero and trainer.global_step > 0:
            # where this attempt started, once its checkpoint is loaded: also checkpoint.resume_from's
            # step, which the worker does not know before (a restart's steps_redone counted from 0)
            (self.job_dir / RESUMED).write_text(str(trainer.global_step))

    def remove_stale(self) -> list[Path]:
        """Removes the `.tmp` saves (step-N.ckpt.tmp, a file or folder, and step-N.ckpt.manifest.tmp)
        that a run killed mid-save left in checkpoints/ (no resume takes them: valid_checkpoints
        reads final names only), and the loss curves of checkpoints that are not there (a save cut
        before its rename left step-N.ckpt.curve-rank{R}.json for good); returns them."""
        stale = sorted(p for p in self.dir.iterdir() if _TMP.match(p.name)
                       or ((m := _CURVE.match(p.name)) and not (self.dir / m.group(1)).exists())) \
            if self.dir.is_dir() else []
        for p in stale:
            _remove(p)
        return stale

    def on_train_end(self, trainer, pl_module) -> None:
        self._note(trainer, force=True)

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx) -> None:
        step = trainer.global_step
        self._note(trainer)
        if not self.every or step == 0 or step % self.every or self._last == step:
            return
        self._last = step            # with accumulation, several micro-batches end one step
        import torch

        t0 = time.perf_counter()
        with torch.profiler.record_function(SAVE_MARK):   # a profile window leaves it out (scaling.breakdown)
            self.save(trainer, step)
        self.save_s.append(round(time.perf_counter() - t0, 4))
        if self.after_save is not None:
            self.after_save(trainer)

    def saved_at(self, step: int) -> Path | None:
        """The checkpoint this callback saved at `step` in this attempt, else None (the same answer
        on every rank: the steps are, not a listing of the shared file system)."""
        return self.dir / f"step-{step:08d}.ckpt" if step in self._saved else None

    def save(self, trainer: Any, step: int) -> Path:
        final = self.dir / f"step-{step:08d}.ckpt"
        tmp = self.dir / f"step-{step:08d}.ckpt.tmp"
        if trainer.is_global_zero:
            self.dir.mkdir(parents=True, exist_ok=True)
            _remove(tmp)
        trainer.strategy.barrier()
        trainer.save_checkpoint(str(tmp), weights_only=False)   # the whole state: resumable
        if self.curve_of is not None:
            write_curve(final, trainer.global_rank, self.curve_of())
        trainer.strategy.barrier()   # every rank's part is on disk
        if trainer.is_global_zero:
            _remove(final)
            os.replace(tmp, final)
            manifest = final.with_name(final.name + MANIFEST)
            manifest.with_suffix(".tmp").write_text(json.dumps({"step": step, "files": _files(final),
                                                                "slurm_job": os.environ.get("SLURM_JOB_ID")}))
            os.replace(manifest.with_suffix(".tmp"), manifest)
            # never the one just written (a checkpoint at a later step, kept from an earlier run
            # that reached max_steps, sorts before it: keep_last=1 deleted each new save); the
            # manifest first, so a kill mid-removal leaves a folder no resume takes for whole
            for old in [c for _, c in valid_checkpoints(self.dir)[0] if c != final][self.keep - 1:]:
                _remove(old.with_name(old.name + MANIFEST))
                _remove(old)
                for curve in old.parent.glob(curve_path(old, "*").name):   # every rank's
                    _remove(curve)
        trainer.strategy.barrier()
        self._saved.add(step)
        return final


def curve_path(ckpt: Path, rank: int | str) -> Path:
    return Path(ckpt).with_name(Path(ckpt).name + f".curve-rank{rank}.json")


def write_curve(ckpt: Path, rank: int, curve: dict) -> None:
    """This rank's loss curve so far beside checkpoint `ckpt`, into its own node's job folder: with a
    folder per node (scalelab k8s --pvc, torchrun nodes given their own hydra.run.dir) only rank 0's
    has checkpoints/ yet."""
    path = curve_path(ckpt, rank)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(curve))


def read_curve(ckpt: Path | str | None, rank: int) -> dict | None:
    """This rank's loss curve up to checkpoint `ckpt` ({"global_steps", "losses"}), or None (none
    kept beside it: saved before curves were kept, or copied without them). The worker reads it
    only for its own job's checkpoints, not for checkpoint.resume_from (another run's curve)."""
    if not ckpt:
        return None
    try:
        curve = json.loads(curve_path(Path(ckpt), rank).read_text())
        return curve if len(curve["global_steps"]) == len(curve["losses"]) else None
    except (OSError, ValueError, KeyError, TypeError):
        return None


def mean_curve(ckpt: Path | str, world: int) -> list[list] | None:
    """The run record's loss curve up to checkpoint CKPT ([[step, loss], ...]: the mean over the
    ranks per step, as run_summary.summarize takes it) from the curves kept beside it; None where
    a rank's is missing (another node's folder, an older checkpoint)."""
    import statistics

    curves = [read_curve(ckpt, r) for r in range(world)]
    if not curves or any(c is None for c in curves):
        return None
    n = min(len(c["losses"]) for c in curves)
    return [[curves[0]["global_steps"][i], statistics.fmean(c["losses"][i] for c in curves)] for i in range(n)]


def _remove(p: Path) -> None:
    if p.is_dir():
        shutil.rmtree(p, ignore_errors=True)
    elif p.exists():
        p.unlink()

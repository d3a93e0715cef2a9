"""Preemption and time limits under SLURM: save, requeue, resume; owned here and nowhere else.

Who gets which signal (measured on slurm-wlm 22.05, shared/notes/local-slurm.md):
- `--signal=USR1@90` (the rendered scripts') and `scancel --signal=USR1 JOB`: the job steps' tasks,
  i.e. the ranks; not the batch step.
- `scancel --signal=USR1 --batch JOB` (and `--signal=B:USR1@90`): the batch step only. The
  rendered script `exec`s the Hydra job, so that is this Python process, which forwards the signal
  to its srun step (srun forwards it to every rank).
- `scontrol requeue`, `scancel`, preemption, the time limit: SIGTERM to every step's tasks and
  the batch step, then SIGKILL after KillWait.

The ranks (RequeueOnSignal, a Lightning callback) agree at the next optimizer step that one of
them was signalled (one all-reduce of a host-memory flag per step, over gloo: on an NCCL job a
gloo group of the same ranks, so reading the flag never waits for the GPU's queued work), save a
checkpoint there (checkpointing.PeriodicCheckpoint's atomic save) and stop; rank 0 writes
JOB_DIR/.preempted. The batch process then requeues the job (`scontrol requeue`) after USR1; after
SIGTERM SLURM itself requeues (scontrol requeue, preemption) or ends (scancel) the job, so it only
saves. The requeued job runs the same script with the same SLURM_JOB_ID, hence the same run dir,
and `checkpoint.resume=auto` continues from the newest checkpoint. Lightning's own requeue is off
(SLURMEnvironment(auto_requeue=False)): it would requeue from rank 0 before the others saved, and
a whole job array at once (Lightning #15022). Outside SLURM too, Lightning's per-batch SIGTERM
broadcast is off (rank_local_sigterm): each rank stops on its own signal.

Outside SLURM (launcher=local, torchrun, a Kubernetes pod), the same callback saves on SIGTERM
when the job checkpoints (saves_on_sigterm: checkpoint.every_n_steps or checkpoint.save): the
launcher passes its SIGTERM (`docker stop`, a pod's eviction, a spot preemption, Ctrl-C) on to
the ranks and waits rank_stop.stop_grace_s for them (torchrun: its shutdown timeout); they agree
on a step, save there and exit STOPPED_EXIT (143, 128 + SIGTERM: what Kubernetes' restartPolicy
ExitCode and the training operator count as retryable), and the same command again in the same
folder, an elastic restart (trainer.max_restarts) or a restarted pod resumes from that checkpoint
(checkpoint.resume=auto). Before, only srun's ranks had the callback: the launcher's SIGTERM then
SIGKILL 5 s later lost every step since the last periodic checkpoint.
"""
from __future__ import annotations

import os
import signal
import subprocess
import sys
from pathlib import Path

# the SLURM job's environment, the rendezvous and gloo's interface live in their own modules; their
# names stay importable from here
from scalelab.gloo_net import gloo_interface, interface_to, outward_interface
from scalelab.rendezvous import master_env
from scalelab.slurm_env import STEP_ENV, expand_nodelist, in_slurm_job, requeue_count, slurm_info

__all__ = ["PREEMPTED", "SIGNALLED", "STOPPED_EXIT", "completed_earlier", "EARLY", "install_early",
           "install_batch_early", "saves_on_sigterm", "requeue_callback", "RequeueOnSignal", "ignore_late",
           "rank_local_sigterm", "end_by_sigterm", "BatchSignals", "stopped_at", "after_ranks",
           # from scalelab.slurm_env, scalelab.rendezvous and scalelab.gloo_net
           "STEP_ENV", "in_slurm_job", "expand_nodelist", "requeue_count", "slurm_info", "master_env",
           "gloo_interface", "interface_to", "outward_interface"]

PREEMPTED = ".preempted"  # JOB_DIR/.preempted: "STEP SIGNAL" of a rank stop this attempt
SIGNALLED = ".signalled"  # JOB_DIR/.signalled: the batch step got USR1 before the ranks could (this attempt)
STOPPED_EXIT = 143  # a rank outside SLURM that saved and stopped for SIGTERM: interrupted, resumable
# How a SIGTERM'd SLURM job's line leaves its end to SLURM (slurm_jobs.finalize rewrites it once
# SLURM has said: a cancelled or timed-out job is not requeued)
SLURM_DECIDES = "; SLURM ends or requeues job {job} itself"
_SIGNALS = (signal.SIGUSR1, signal.SIGTERM)


def completed_earlier(record: dict | None, overrides: list[str], environ=None) -> bool:
    """Whether `record` (the job dir's run.json) is a completed run of an earlier attempt of this
    very SLURM job, with these overrides. SLURM requeues finished work too: `scontrol requeue` of
    a finished job, or a preemption or requeue that lands between the last step and the job's
    exit. Starting over there would redo the whole run and replace its record (seen in CI: a
    `scontrol requeue` that landed after the last step restarted the run from step 0). Only the
    batch step's own final record counts (its `ranks_exited` mark): rank 0's record, written
    before the batch step adds its part, may be all that is left of an attempt killed meanwhile."""
    env = os.environ if environ is None else environ
    info = slurm_info(env)
    from scalelab.results.record import completed_final

    if info is None or requeue_count(env) == 0 or not completed_final(record):
        return False
    return ((record.get("slurm") or {}).get("job_id") == info["job_id"]
            and (record.get("job") or {}).get("overrides") == list(overrides))


# ---- the ranks ---------------------------------------------------------------------------------
EARLY: list[int] = []  # a warning signal that arrived while the rank was still starting


def install_early() -> None:
    """First thing in a rank under srun, before the imports (10+ s): the warning signal's default
    action would kill a starting rank (seen with a short time limit: `tasks 0-1: User defined
    signal 1`); it is noted instead and acted on at the first step (RequeueOnSignal)."""
    if os.environ.get(STEP_ENV) == "1":
        signal.signal(signal.SIGUSR1, lambda signum, frame: EARLY.append(signum))


def install_batch_early() -> None:
    """First thing in the batch step (the Hydra job that will run srun): until BatchSignals takes
    over, a USR1 (`scancel --signal=USR1 --batch`) is noted, not acted on: its default action would
    kill the job, and ignoring it (as before) lost the warning, so the job ran into its time limit
    with no checkpoint."""
    signal.signal(signal.SIGUSR1, lambda signum, frame: EARLY.append(signum))


def saves_on_sigterm(cfg) -> bool:
    """Whether a job's ranks save a checkpoint when stopped by SIGTERM outside SLURM: it
    checkpoints at all (checkpoint.every_n_steps, or checkpoint.save at the end)."""
    ckpt = cfg.get("checkpoint") or {}
    return bool(ckpt.get("every_n_steps") or ckpt.get("save"))


def requeue_callback(job_dir: Path, saver, slurm: bool = True):
    """The Lightning callback for ranks under srun, and outside SLURM for a job that checkpoints
    (slurm=False: SIGTERM only; built here so the batch side does not import Lightning). saver:
    the PeriodicCheckpoint whose atomic save writes the checkpoint."""
    import lightning as L

    class _Requeue(RequeueOnSignal, L.Callback):
        pass

    return _Requeue(job_dir, saver, slurm)


class RequeueOnSignal:
    def __init__(self, job_dir: Path, saver, slurm: bool = True):
        self.job_dir, self.saver = Path(job_dir), saver
        # under srun: USR1 (the time limit's warning, a requeue) and SIGTERM; elsewhere SIGTERM only
        # (the launcher's, passed on from `docker stop`, a pod's eviction, Ctrl-C)
        self.slurm, self.signals = slurm, (_SIGNALS if slurm else (signal.SIGTERM,))
        self.signalled: int | None = None  # the signal this rank got
        self.stopped_at: int | None = None
        self._seen = -1
        self._group = None  # the process group of the flag's all-reduce (None: the default one)

    def _handler(self, signum, frame) -> None:
        self.signalled = signum  # only a flag: the save needs every rank, at a step boundary

    def on_train_start(self, trainer, pl_module) -> None:
        # After Lightning registered its own handlers (its SIGTERM one would raise in the loop)
        for s in self.signals:
            signal.signal(s, self._handler)
        if self.slurm and EARLY and self.signalled is None:
            self.signalled = EARLY[-1]
        if self.slurm and (self.job_dir / SIGNALLED).exists() and self.signalled is None:
            # the batch step got USR1 while this rank was starting (srun may have had no task to
            # forward it to yet): it is this rank's too
            self.signalled = signal.SIGUSR1
        if getattr(trainer, "received_sigterm", False) and self.signalled is None:
            # a SIGTERM between fit's own handlers and these: Lightning's flag would stop this rank
            # alone after its batch, without the save; it is ours now
            self.signalled = signal.SIGTERM
            trainer._signal_connector.received_sigterm = False
        # the first check is at the end of the first whole step: with accumulation, the first
        # micro-batches still report the start (or resumed) step, and a save there would be mid-step
        self._seen = trainer.global_step
        import torch.distributed as dist

        if dist.is_available() and dist.is_initialized() and dist.get_backend() != "gloo":
            from scalelab.strategies.group_timeout import default_timeout

            # every rank runs on_train_start, so every rank creates the group (a collective); its
            # timeout the default group's (trainer.collective_timeout_s), not gloo's 30 min
            self._group = dist.new_group(backend="gloo", timeout=default_timeout())

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx) -> None:
        step = trainer.global_step
        if step == self._seen:  # not an optimizer step's end (gradient accumulation)
            return
        self._seen = step
        import torch
        import torch.distributed as dist

        # The flag lives in host memory and is all-reduced over gloo (the default group of a CPU
        # job, a gloo group of the same ranks on an NCCL job): `.item()` then reads host memory.
        # A CUDA flag all-reduced over NCCL would be read with a device sync every step, draining
        # the queue (issue 11); read a few steps late instead it would stop the ranks later than
        # the signal, eating into SLURM's KillWait after a SIGTERM.
        flag = torch.full((1,), self.signalled or 0, dtype=torch.int32)
        if dist.is_available() and dist.is_initialized():
            dist.all_reduce(flag, op=dist.ReduceOp.MAX, group=self._group)  # one rank signalled: all stop
        sig = int(flag.item())
        if not sig:
            return
        if step < trainer.max_steps:  # at max_steps the run is finishing anyway: nothing to save
            # a periodic save of this very step ran just before (it precedes this callback): that
            # checkpoint, not a second save of the same state inside the warning's window (it also
            # removed the good copy before renaming the new one; found by review)
            path = self.saver.saved_at(step) or self.saver.save(trainer, step)
            if not self.slurm and trainer.local_rank == 0 and not trainer.is_global_zero:
                # each node's own folder (launcher=torchrun: JOB_DIR/nodeK) says its ranks stopped for a save
                (self.job_dir / PREEMPTED).write_text(f"{step} {signal.Signals(sig).name}")
            if trainer.is_global_zero:
                from scalelab.console import end_bar_line

                (self.job_dir / PREEMPTED).write_text(f"{step} {signal.Signals(sig).name}")
                end_bar_line()
                # USR1: the batch step requeues the job; SIGTERM: SLURM requeues it or ends it (scancel)
                then = ("stopping for the requeue" if sig == signal.SIGUSR1 else
                        "stopping (SLURM requeues or ends the job)" if self.slurm else
                        "stopping (the same command in the same folder goes on from it)")
                # outside SLURM the signal is the launcher's forwarding of whatever stopped it (a Ctrl-C read
                # "SIGTERM: ..."): its own line after this one names the cause
                said = f"{signal.Signals(sig).name}: " if self.slurm or sig == signal.SIGUSR1 else ""
                print(f"[scalelab] {said}checkpoint {path} saved at step {step}; {then}", flush=True)
            self.stopped_at = step
            trainer.should_stop = True


def ignore_late() -> None:
    """After fit: a warning signal has nothing left to save (the run is writing its record or
    exiting), and a Python handler would not protect the rank anyway once the interpreter
    finalizes (it restores the default action, which kills). Measured: a USR1 in that window
    killed ranks that had finished all their steps."""
    signal.signal(signal.SIGUSR1, signal.SIG_IGN)


def rank_local_sigterm(trainer) -> None:
    """Every multi-rank run, before fit: Lightning 2.6 agrees on SIGTERM with a collective per
    batch (_TrainingEpochLoop._broadcast_sigterm_tensor: a flag tensor made on the rank's device,
    broadcast from rank 0 on the default group, then `.item()`), and its SIGTERM handler
    broadcasts too. That is a collective and a device drain per step in every run at world size
    2+, `single`'s independent replicas included (their comm share on CPU: 3-11 %); the H200 runs
    at world size 1 never saw it. Here a rank that gets SIGTERM stops on its own after its
    batch (the loop's SIGTERMException); a peer that does not get it is ended by the launcher
    (spawn, torchrun), and under SLURM every rank gets it and RequeueOnSignal agrees on the step
    over a host flag."""
    conn, loop = trainer._signal_connector, trainer.fit_loop.epoch_loop

    def notifier(signum, frame) -> None:   # Lightning's _sigterm_notifier_fn without its broadcast
        if not conn.received_sigterm and trainer.strategy.launcher is not None:
            trainer.strategy.launcher.kill(signum)
        conn.received_sigterm = True

    conn._sigterm_notifier_fn = notifier       # registered by fit (register_signal_handlers)
    loop._broadcast_sigterm_tensor = lambda: None


def end_by_sigterm(exc: BaseException) -> None:
    """A rank Lightning stopped on SIGTERM (its SIGTERMException, a SystemExit with no code: exit
    status 0) ends by that signal instead, so its launcher names it (spawn's first-failure rule,
    torchrun) and not the peer that then lost its connection to it."""
    from lightning.pytorch.utilities.exceptions import SIGTERMException

    if isinstance(exc, SIGTERMException):
        sys.stdout.flush()
        sys.stderr.flush()
        signal.signal(signal.SIGTERM, signal.SIG_DFL)
        os.kill(os.getpid(), signal.SIGTERM)


# ---- the batch step (the Hydra job that runs srun) ---------------------------------------------
class BatchSignals:
    """In the batch step while the ranks run: USR1 is forwarded to the srun step (it reaches the
    ranks) and left in JOB_DIR/.signalled for ranks still starting (on_train_start reads it); a
    USR1 that came before (install_batch_early) is passed on the same way. SIGTERM is only noted
    (SLURM signals the ranks itself; a second SIGTERM to srun would make it kill them before they
    save)."""

    def __init__(self, job_dir: Path):
        self.job_dir = Path(job_dir)
        self.got: list[int] = []
        self.proc = None
        self._old = {}

    def __enter__(self):
        (self.job_dir / SIGNALLED).unlink(missing_ok=True)  # an earlier attempt's
        for s in _SIGNALS:
            self._old[s] = signal.signal(s, self._handler)
        if signal.SIGUSR1 in EARLY:
            EARLY.clear()
            print("[scalelab] SIGUSR1 while the job was starting: the ranks save at their first step and the "
                  "job is requeued", flush=True)
            self._handler(signal.SIGUSR1, None)
        return self

    def __exit__(self, *exc):
        for s, h in self._old.items():
            signal.signal(s, h)

    def _handler(self, signum, frame) -> None:
        self.got.append(signum)
        if signum != signal.SIGUSR1:
            return
        if self.proc is not None and self.proc.poll() is None:
            os.kill(self.proc.pid, signal.SIGUSR1)
        try:   # for ranks still starting; never raise here (the main thread would end the ranks unsaved)
            (self.job_dir / SIGNALLED).write_text("SIGUSR1")
        except OSError:
            pass


def stopped_at(job_dir: Path) -> tuple[int, str] | None:
    """(step, signal name) of this attempt's stop for a signal (JOB_DIR/.preempted), else None."""
    try:
        step, _, name = (job_dir / PREEMPTED).read_text().partition(" ")
        return int(step), name.strip()
    except (OSError, ValueError):
        return None


def after_ranks(job_dir: Path, got: list[int], finished: bool = False) -> str | None:
    """After the ranks exited: None when they did not stop for a signal (or finished the run
    anyway: `finished`); else what was done, in one line. Requeues the job unless SLURM is already
    requeueing or ending it (SIGTERM)."""
    stop = stopped_at(job_dir)
    info = slurm_info() or {}
    if stop is None:
        if signal.SIGTERM not in got or finished:
            return None
        # The ranks were ended before they could save (within KillWait; a W&B service process in
        # the step gets SIGTERM too and its rank fails on the next log call).
        from scalelab.checkpointing import find_resume

        newest = find_resume(job_dir)[0]
        then = (f"it resumes from the newest periodic checkpoint ({newest.name})" if newest else
                "it starts over: there is no checkpoint yet (checkpoint.every_n_steps=N saves one every N steps)")
        return f"SIGTERM: ranks ended without a new checkpoint; if SLURM requeues job {info.get('job_id')}, {then}"
    step, name = stop
    # an array task by its ARRAY_TASK id: its raw SLURM_JOB_ID is the whole array's for one of the
    # tasks, and `scontrol requeue` of that requeued (and killed) every task of the array
    job = info.get("job_id") or os.environ.get("SLURM_JOB_ID", "")
    if signal.SIGTERM in got or name == "SIGTERM":
        return (f"SIGTERM: checkpoint saved at step {step}{SLURM_DECIDES.format(job=info.get('job_id'))} "
                "(a requeued job resumes from it)")
    proc = subprocess.run(["scontrol", "requeue", job], capture_output=True, text=True)
    if proc.returncode != 0:
        return (f"{name}: checkpoint saved at step {step}, but `scontrol requeue {job}` failed: "
                f"{(proc.stderr or proc.stdout).strip()[:200]} (submit with --requeue)")
    return f"{name}: checkpoint saved at step {step}; job {info.get('job_id')} requeued (requeue {info.get('requeues', 0) + 1})"

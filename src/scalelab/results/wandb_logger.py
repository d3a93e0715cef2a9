"""Lightning's WandbLogger, except that losing the W&B service stops the logging, not the run.

W&B logs through a service process (wandb-core) that rank 0 starts. A SLURM preemption or
`scontrol requeue` sends SIGTERM to every process of the job step, wandb-core included, and it
exits at once, while the ranks are still finishing the step they will checkpoint: rank 0's next
`log_metrics` (Lightning's ThroughputMonitor logs from on_train_batch_end) then raised
ConnectionResetError, rank 0 died before the save, and the requeued job went back to the last
periodic checkpoint (found by a user walkthrough on the local SLURM cluster, 2026-12-01: job 103
lost steps 186-417). What the service received before it went is already in the run's files;
after it, the run's own record (run.json), its checkpoints and the console go on, with one line
that says W&B stopped and why.
"""
from __future__ import annotations

from lightning.pytorch.loggers import WandbLogger


def _service_errors() -> tuple[type[BaseException], ...]:
    """What wandb raises once its service is gone: the socket's OSError family (ConnectionReset,
    BrokenPipe), wandb's own errors, and its mailbox's closed / abandoned handles. Not every
    exception: a bad value logged is still an error."""
    import wandb

    kinds: list[type[BaseException]] = [OSError, wandb.Error]
    try:
        from wandb.sdk.mailbox.mailbox import MailboxClosedError
        from wandb.sdk.mailbox.mailbox_handle import HandleAbandonedError

        kinds += [MailboxClosedError, HandleAbandonedError]
    except ImportError:  # another wandb: its socket errors are still OSErrors
        pass
    return tuple(kinds)


def _forget_the_service() -> None:
    """wandb.teardown() drops wandb's connection and its atexit hook before it tries to tell the
    service (which raises, the service being gone): without it, a rank that exits through the
    interpreter's teardown (srun, torchrun ranks) printed that hook's ConnectionResetError
    traceback as its last words."""
    import wandb

    try:
        wandb.teardown()
    except (Exception, SystemExit):  # noqa: BLE001 - the service is gone: the message to it fails, or
        pass                         # its exit status (-15 after SIGTERM) comes back as sys.exit


def finish_failed_run() -> None:
    """Close this process's W&B run, if it has one, as failed (exit code 1). A rank whose fit raised
    ends by os._exit (forked ranks) without W&B's atexit hook: its offline run stayed a 7-byte
    header, no config, history or exit, which `wandb sync` refused ('transactionlog: EOF')."""
    import signal
    import sys

    wandb = sys.modules.get("wandb")
    if wandb is None or getattr(wandb, "run", None) is None:
        return
    # the launcher's SIGTERM to the ranks left after a peer's failure (its SIGKILL follows seconds
    # later) would end the finish midway: the run's file cut, as before
    before = signal.signal(signal.SIGTERM, signal.SIG_IGN)
    try:
        wandb.finish(exit_code=1)
    except _service_errors():   # the service is gone: what it received is in the run's file
        _forget_the_service()
    except Exception as e:  # noqa: BLE001 - never in place of the rank's own error
        print(f"[scalelab] warning: W&B could not close the failed run ({type(e).__name__}: {e})", file=sys.stderr)
    finally:
        signal.signal(signal.SIGTERM, before)


class TolerantWandbLogger(WandbLogger):
    """WandbLogger whose calls into a W&B service that has gone away warn once and do nothing."""

    lost: str | None = None   # why W&B stopped, once it has

    def _guarded(self, what: str, fn, *args, **kwargs):
        if self.lost is not None:
            return None
        try:
            return fn(*args, **kwargs)
        except _service_errors() as e:
            self.lost = f"{type(e).__name__}: {str(e).strip().splitlines()[0] if str(e).strip() else ''}"
            print(f"[scalelab] warning: W&B stopped logging at {what} ({self.lost}): its service process "
                  "ended (a preemption's SIGTERM ends it with the ranks); training, checkpoints and run.json "
                  "go on", flush=True)
            _forget_the_service()
            return None

    def log_metrics(self, metrics, step=None) -> None:
        self._guarded(f"step {step}", super().log_metrics, metrics, step)

    def log_hyperparams(self, params, *args, **kwargs) -> None:
        self._guarded("the hyperparameters", super().log_hyperparams, params, *args, **kwargs)

    def finish(self, summary: dict | None = None) -> None:
        """Add `summary` to the run's summary and close the run (rank 0's one W&B run per job)."""
        import wandb

        def close():
            if summary:
                self.experiment.summary.update(summary)
            wandb.finish()

        self._guarded("the end of the job", close)

"""What a rank prints: rank 0 speaks, the other ranks print errors only, library chatter is off
unless `verbose=true`, and the progress bar counts optimizer steps.

Measured noise this removes (2-rank zero2 on CPU): Lightning's GPU/TPU banners, DeepSpeed's
"initializing deepspeed distributed" and op-build lines once per rank, a torch FutureWarning
once per rank, Kineto's `USDT ... profiler_start/stop` lines around the profile window, and a
progress bar reading `Epoch 0/-2` (Lightning counts epochs; a run here is max_steps steps).
"""
from __future__ import annotations

import contextlib
import io
import logging
import os
import sys
import time
import warnings

from lightning.pytorch.callbacks.progress import ProgressBar

# Loggers whose INFO lines are banners or per-rank set-up chatter, not results.
_CHATTY = ("lightning.pytorch.utilities.rank_zero", "lightning.fabric.utilities.rank_zero",
           "lightning.pytorch.strategies.deepspeed", "lightning.pytorch.accelerators.cuda", "DeepSpeed",
           "torch.utils.cpp_extension", "lightning.fabric.utilities.distributed", "lightning.pytorch.strategies.ddp")


_VERBOSE = [False]   # this rank's verbose=, for quiet_banner


@contextlib.contextmanager
def quiet_banner(banner: str = "built successfully"):
    """Lines with `banner` that a library prints to stdout meanwhile (DeepSpeed's
    '... built successfully' of DeepSpeed's op builders) only with verbose=true; anything
    else it printed still comes out, after (or as it fails)."""
    if _VERBOSE[0]:
        yield
        return
    caught = io.StringIO()
    try:
        with contextlib.redirect_stdout(caught):
            yield
    finally:
        rest = "".join(line for line in caught.getvalue().splitlines(keepends=True) if banner not in line)
        if rest:
            sys.stdout.write(rest)
            sys.stdout.flush()


def quiet_rank(rank: int, verbose: bool) -> None:
    """Call first thing in a rank."""
    _VERBOSE[0] = verbose
    # Advertising tips and deprecations inside the libraries themselves; real warnings stay.
    for name in ("lightning.pytorch.utilities.rank_zero", "lightning.fabric.utilities.rank_zero"):
        logging.getLogger(name).addFilter(lambda r: not str(r.msg).startswith("💡 Tip"))
    warnings.filterwarnings("ignore", message=r".*isinstance\(treespec, LeafSpec\)")
    warnings.filterwarnings("ignore", message=r".*The anonymous setting has no effect.*")
    # Wrong here: a local run on a host with a SLURM client (scalelab starts srun itself for SLURM
    # jobs), and a resume mid-epoch (GlobalBatchSampler restarts at the step's sample; checkpoints
    # are at whole steps: a resumed curve equals the uninterrupted one, with accumulation too,
    # test_elastic / test_fsdp_tp / test_deepspeed / test_pipeline)
    warnings.filterwarnings("ignore", message=r"The `srun` command is available on your system but is not used")
    warnings.filterwarnings("ignore", message=r"You're resuming from a checkpoint that ended before the epoch ended")
    if verbose:
        return
    # (verbose=true shows them) torch.distributed's deprecations of what DeepSpeed calls (all_gather_into_tensor,
    # reduce_scatter_tensor, _all_gather_base ...): zero3 printed one per step (20 in a 20-step job)
    warnings.filterwarnings("ignore", message=r"`torch\.distributed\.\w+` (is|will be) deprecated")
    warnings.filterwarnings("ignore", message=r"`torch\.distributed\._\w+` is a private function and will be deprecated")
    for name in _CHATTY:
        logging.getLogger(name).setLevel(logging.WARNING)
    # every ZeRO run with SGD (Lightning allows any optimizer under ZeRO): scalelab's equivalence tests
    # run ZeRO with SGD against one device (tests/integration/test_deepspeed.py); verbose=true shows it
    logging.getLogger("DeepSpeed").addFilter(lambda r: "untested optimizer" not in str(r.msg))
    if rank != 0:
        # Errors only: stderr stays (tracebacks, error lines); stdout and warnings go.
        warnings.simplefilter("ignore")
        for name in ("", "lightning", "lightning.pytorch", "lightning.fabric", "DeepSpeed"):
            logging.getLogger(name).setLevel(logging.ERROR)
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, 1)                    # C-level prints too (DeepSpeed/ninja build lines)
        sys.stdout = open(os.devnull, "w")     # noqa: SIM115 - lives as long as the rank


_BAR = {"open": False}  # rank 0's step line was written without its newline yet


def end_bar_line() -> None:
    """Before a line printed mid-run (a rank's requeue save): it starts on a line of its own
    instead of after the step line's padding."""
    if _BAR["open"]:
        sys.stdout.write("\n")
        _BAR["open"] = False


# Where the launcher's console is no terminal (SLURM's .out, a file, a pipe): one line per this many
# seconds instead of a line rewritten in place twice a second (a 20-step job's .out held its 20
# updates as one 1,400-character line joined by \r: found by review)
LOG_EVERY_S = 30.0


class StepProgressBar(ProgressBar):
    """One line on rank 0, rewritten in place: `step N/max_steps | tokens/s | loss`, updated once
    per optimizer step at most every `every_s`; where the launcher's console is no terminal
    (SCALELAB_CONSOLE_TTY=0, launch.rank_env), a line of its own every LOG_EVERY_S and at the end."""

    def __init__(self, tokens_per_sample: int | None, global_batch: int, every_s: float = 0.5):
        super().__init__()
        self._tty = os.environ.get("SCALELAB_CONSOLE_TTY", "1") != "0"
        every_s = every_s if self._tty else max(every_s, LOG_EVERY_S)
        self.tokens_per_sample, self.global_batch, self.every_s = tokens_per_sample, global_batch, every_s
        self._enabled = True
        self._t0 = self._last_print = 0.0
        self._step0 = 0
        self._shown_loss = None   # the loss of the previous print, read from host memory
        self._loss_reads = None

    def disable(self) -> None:
        self._enabled = False

    def enable(self) -> None:
        self._enabled = True

    def on_train_start(self, trainer, pl_module) -> None:
        self._t0 = time.perf_counter()
        self._step0 = trainer.global_step

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx) -> None:
        step, last = trainer.global_step, trainer.max_steps
        now = time.perf_counter()
        if not (self._enabled and trainer.is_global_zero) or (now - self._last_print < self.every_s and step < last):
            return
        self._last_print = now
        done = step - self._step0
        rate = done * self.global_batch / (now - self._t0) if done and now > self._t0 else 0.0
        speed = f"{rate * self.tokens_per_sample:,.0f} tokens/s" if self.tokens_per_sample else f"{rate:,.1f} samples/s"
        loss = trainer.callback_metrics.get("train/loss")
        if loss is not None:   # float(loss) would drain a CUDA device's queue: show it one print late
            from scalelab.scaling.metrics import LaggedReads

            if self._loss_reads is None:   # (an empty LaggedReads is falsy: it has __len__)
                self._loss_reads = LaggedReads(lag=1)
            due = self._loss_reads.push(step, loss) if step < last else [*self._loss_reads.push(step, loss),
                                                                         *self._loss_reads.drain()]
            self._shown_loss = due[-1][1][0] if due else self._shown_loss
        loss = self._shown_loss
        # several ranks: this is rank 0's own micro-batch loss (the table's is the mean over the
        # data-parallel ranks, which would need a collective per print)
        which = "rank-0 loss" if trainer.world_size > 1 else "loss"
        text = f"step {step}/{last} | {speed}" + (f" | {which} {loss:.4f}" if loss is not None else "")
        if self._tty:
            sys.stdout.write("\r" + text.ljust(60) + ("\n" if step >= last else ""))
        else:
            sys.stdout.write(text + "\n")
        _BAR["open"] = self._tty and step < last
        sys.stdout.flush()

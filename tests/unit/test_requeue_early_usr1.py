"""A USR1 to the batch step while the job is still starting (`scancel --signal=USR1 --batch`
before srun runs the ranks) is passed on: before, the batch step ignored it (SIG_IGN) and the
job ran on into its time limit with no checkpoint and no line saying why."""
import os
import signal
from types import SimpleNamespace

import pytest

from scalelab import requeue


@pytest.fixture
def handlers():
    old = {s: signal.getsignal(s) for s in (signal.SIGUSR1, signal.SIGTERM)}
    requeue.EARLY.clear()
    yield
    requeue.EARLY.clear()
    for s, h in old.items():
        signal.signal(s, h)


def _trainer():
    return SimpleNamespace(global_step=0, received_sigterm=False)


def test_a_usr1_before_the_ranks_start_reaches_them(tmp_path, handlers, capsys):
    requeue.install_batch_early()
    os.kill(os.getpid(), signal.SIGUSR1)                      # the batch step is still importing
    (tmp_path / requeue.SIGNALLED).write_text("SIGUSR1")      # left by an earlier attempt: replaced
    with requeue.BatchSignals(tmp_path) as signals:
        assert signals.got == [signal.SIGUSR1]
        assert (tmp_path / requeue.SIGNALLED).exists()
        rank = requeue.RequeueOnSignal(tmp_path, saver=None)  # a rank that starts after it
        rank.on_train_start(_trainer(), None)
        assert rank.signalled == signal.SIGUSR1
    assert "SIGUSR1 while the job was starting" in capsys.readouterr().out
    assert requeue.EARLY == []


def test_without_a_signal_the_ranks_are_not_stopped(tmp_path, handlers):
    (tmp_path / requeue.SIGNALLED).write_text("SIGUSR1")      # an earlier attempt's
    requeue.install_batch_early()
    with requeue.BatchSignals(tmp_path) as signals:
        assert not (tmp_path / requeue.SIGNALLED).exists()
        rank = requeue.RequeueOnSignal(tmp_path, saver=None)
        rank.on_train_start(_trainer(), None)
        assert rank.signalled is None and signals.got == []
        signal.signal(signal.SIGUSR1, signals._handler)        # the rank is another process
        os.kill(os.getpid(), signal.SIGUSR1)                  # while a rank is still starting
        assert signals.got == [signal.SIGUSR1] and (tmp_path / requeue.SIGNALLED).exists()
        late = requeue.RequeueOnSignal(tmp_path, saver=None)
        late.on_train_start(_trainer(), None)
        assert late.signalled == signal.SIGUSR1


def test_the_save_line_starts_on_its_own_line_and_says_what_follows(tmp_path, handlers, capsys):
    from scalelab import console

    class Saver:
        def save(self, trainer, step):
            return tmp_path / f"step-{step}.ckpt"

        def saved_at(self, step):
            return None

    def stop(sig):
        rank = requeue.RequeueOnSignal(tmp_path, Saver())
        trainer = SimpleNamespace(global_step=3, max_steps=10, is_global_zero=True, should_stop=False)
        rank._seen, rank.signalled = 2, sig
        console._BAR["open"] = True                                # rank 0's step line, no newline yet
        rank.on_train_batch_end(trainer, None, None, None, 0)
        assert trainer.should_stop and (tmp_path / requeue.PREEMPTED).read_text() == f"3 {sig.name}"
        return capsys.readouterr().out

    out = stop(signal.SIGUSR1)
    assert out.startswith("\n[scalelab] SIGUSR1: checkpoint ") and out.rstrip().endswith("stopping for the requeue")
    out = stop(signal.SIGTERM)     # scancel ends the job; a requeue or preemption is SLURM's own
    assert out.rstrip().endswith("saved at step 3; stopping (SLURM requeues or ends the job)")


def test_a_sigterm_before_any_checkpoint_says_a_requeue_starts_over(tmp_path, monkeypatch):
    """The line promised 'it resumes from the newest periodic checkpoint' for a job cancelled while
    its ranks were starting, with no checkpoint at all (walkthrough: jobs 669, 682)."""
    monkeypatch.setenv("SLURM_JOB_ID", "669")
    line = requeue.after_ranks(tmp_path, [signal.SIGTERM])
    assert line.endswith("if SLURM requeues job 669, it starts over: there is no checkpoint yet "
                         "(checkpoint.every_n_steps=N saves one every N steps)"), line

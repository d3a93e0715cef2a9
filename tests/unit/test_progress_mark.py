"""JOB_DIR/.progress (checkpointing.PeriodicCheckpoint): every step when an elastic restart needs
the exact step (trainer.max_restarts > 0), else at most once a second plus the last step at the
end (a file write per step cost 0.4-3.5 ms of host time on this VM's disk)."""
from __future__ import annotations

from types import SimpleNamespace

from scalelab import checkpointing
from scalelab.checkpointing import PROGRESS, PeriodicCheckpoint


def _run(tmp_path, monkeypatch, note_progress, times):
    clock = iter(times)
    monkeypatch.setattr(checkpointing.time, "monotonic", lambda: next(clock))
    cb = PeriodicCheckpoint(tmp_path, every=None, keep=2, note_progress=note_progress)
    trainer = SimpleNamespace(global_step=0, is_global_zero=True)
    seen = []
    for step in range(1, len(times)):
        trainer.global_step = step
        cb.on_train_batch_end(trainer, None, None, None, step - 1)
        seen.append(int((tmp_path / PROGRESS).read_text()))
    cb.on_train_end(trainer, None)
    return seen, int((tmp_path / PROGRESS).read_text())


def test_every_step_for_elastic_restarts(tmp_path, monkeypatch):
    seen, last = _run(tmp_path, monkeypatch, True, [0.0, 0.1, 0.2, 0.3, 0.4])
    assert seen == [1, 2, 3, 4] and last == 4


def test_once_a_second_otherwise_and_the_last_step_at_the_end(tmp_path, monkeypatch):
    # steps 1..5 end at t = 0.0, 0.4, 0.9, 1.1, 1.5; the end of training at t = 1.6
    seen, last = _run(tmp_path, monkeypatch, False, [0.0, 0.4, 0.9, 1.1, 1.5, 1.6])
    assert seen == [1, 1, 1, 4, 4] and last == 5


def test_a_resumed_run_with_accumulation_saves_whole_steps_only(tmp_path, monkeypatch):
    """Resumed at step 4 (a checkpoint every 2 steps), 2 micro-batches per step: the first
    micro-batch ends still reporting step 4 and must not save step 4 again, mid-step (a later
    resume from it ran a micro-batch off); step 6 is saved once, after its last micro-batch.
    End to end, as a user runs it: tests/integration/test_elastic.py (slow)."""
    cb = PeriodicCheckpoint(tmp_path, every=2, keep=2, note_progress=False)
    saved = []
    monkeypatch.setattr(cb, "save", lambda trainer, step: saved.append(step))
    trainer = SimpleNamespace(global_step=4, is_global_zero=True)
    cb.on_train_start(trainer, None)
    ends = [4, 5, 5, 6, 6, 7]        # global_step after each micro-batch: 5 ends at its 2nd, ...
    for i, step in enumerate(ends):
        trainer.global_step = step
        cb.on_train_batch_end(trainer, None, None, None, i)
    assert saved == [6]


def test_the_step_an_attempt_started_at_is_noted_once_its_checkpoint_is_loaded(tmp_path):
    """JOB_DIR/.resumed: a restart's steps_redone = where it failed - where this attempt started.
    A run started from checkpoint.resume_from (step 4 of another run) and restarted before its own
    first checkpoint counted its redone steps from 0: the worker knows that step only once the
    checkpoint is loaded, at train start."""
    from scalelab.checkpointing import RESUMED

    cb = PeriodicCheckpoint(tmp_path, every=10, keep=2)
    cb.on_train_start(SimpleNamespace(global_step=0, is_global_zero=True), None)   # a fresh start
    assert not (tmp_path / RESUMED).exists()
    cb.on_train_start(SimpleNamespace(global_step=4, is_global_zero=False), None)  # not rank 0's to write
    assert not (tmp_path / RESUMED).exists()
    cb.on_train_start(SimpleNamespace(global_step=4, is_global_zero=True), None)
    assert (tmp_path / RESUMED).read_text() == "4"


def test_torchrun_restarts_count_the_steps_redone(tmp_path):
    """Under torchrun, rank 0 of each restarted attempt counts the restart and the steps the failed
    attempt did past the new resume point (checkpointing.note_restart), as spawn.run_job does for
    launcher=local; an attempt that failed before its first step redid none; once per attempt."""
    from scalelab.checkpointing import note_restart, read_restarts

    assert read_restarts(tmp_path) == {"restarts": 0, "steps_redone": 0}
    (tmp_path / PROGRESS).write_text("12")                        # attempt 0 reached step 12
    assert note_restart(tmp_path, 1, 10) == {"restarts": 1, "steps_redone": 2}   # resumes at 10
    assert (tmp_path / PROGRESS).read_text() == "10"
    assert note_restart(tmp_path, 1, 10) == {"restarts": 1, "steps_redone": 2}   # the same attempt again
    # attempt 1 failed before its first step: attempt 2 resumes at 10 again and redoes nothing more
    assert note_restart(tmp_path, 2, 10) == {"restarts": 2, "steps_redone": 2}
    (tmp_path / PROGRESS).write_text("17")                        # attempt 2 reached step 17
    assert note_restart(tmp_path, 3, 15) == {"restarts": 3, "steps_redone": 4}    # resumes at 15
    assert read_restarts(tmp_path) == {"restarts": 3, "steps_redone": 4}

"""PeriodicCheckpoint's save and keep_last pruning on a fake trainer (the saves are real files):
the checkpoint just written is never pruned, a manifest goes before its folder, and a warning
signal at a step just saved reuses that checkpoint instead of saving it again (requeue)."""
from __future__ import annotations

import signal
from types import SimpleNamespace

from scalelab.checkpointing import MANIFEST, PeriodicCheckpoint, valid_checkpoints
from scalelab.requeue import RequeueOnSignal


class FakeTrainer(SimpleNamespace):
    def __init__(self):
        super().__init__(global_step=0, global_rank=0, is_global_zero=True, max_steps=100, should_stop=False,
                         strategy=SimpleNamespace(barrier=lambda *a: None), saves=[])

    def save_checkpoint(self, path, weights_only=False):
        self.saves.append(path)
        with open(path, "w") as f:
            f.write(f"state at {self.global_step}")


def _steps(cb):
    return [step for step, _ in valid_checkpoints(cb.dir)[0]]


def test_keep_last_keeps_the_newest_and_never_the_one_just_written(tmp_path):
    cb, t = PeriodicCheckpoint(tmp_path, every=10, keep=2), FakeTrainer()
    for step in (10, 20, 30):
        t.global_step = step
        cb.on_train_batch_end(t, None, None, None, 0)
    assert _steps(cb) == [30, 20]
    # a checkpoint at a later step kept from an earlier run (which reached its max_steps 100)
    # sorts first: with keep_last=1 each new save used to delete itself
    one = PeriodicCheckpoint(tmp_path / "b", every=10, keep=1)
    t.global_step = 100
    one.save(t, 100)
    t.global_step = 60
    one.save(t, 60)
    assert _steps(one) == [60]


def test_a_signal_at_a_step_just_saved_reuses_that_checkpoint(tmp_path):
    cb, t = PeriodicCheckpoint(tmp_path, every=10, keep=3), FakeTrainer()
    on_signal = RequeueOnSignal(tmp_path, cb)
    on_signal._seen = 0
    t.global_step = 10
    cb.on_train_batch_end(t, None, None, None, 0)             # the periodic save of step 10
    on_signal.signalled = signal.SIGUSR1                       # USR1 arrived during step 10
    on_signal.on_train_batch_end(t, None, None, None, 0)
    assert len(t.saves) == 1 and on_signal.stopped_at == 10 and t.should_stop
    assert (tmp_path / ".preempted").read_text() == "10 SIGUSR1" and _steps(cb) == [10]
    t2, cb2 = FakeTrainer(), PeriodicCheckpoint(tmp_path / "c", every=10, keep=3)
    on2 = RequeueOnSignal(tmp_path / "c", cb2)
    on2._seen, t2.global_step, on2.signalled = 0, 13, signal.SIGUSR1
    (tmp_path / "c").mkdir()
    on2.on_train_batch_end(t2, None, None, None, 0)            # between saves: saved now
    assert len(t2.saves) == 1 and _steps(cb2) == [13]
    assert (cb2.dir / f"step-00000013.ckpt{MANIFEST}").exists()

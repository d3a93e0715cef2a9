"""scaling/device_syncs.py: counting torch's synchronizing CUDA calls per steady step from the
warnings of torch.cuda.set_sync_debug_mode("warn"). On CPU: a trainer whose root device says cuda,
a recorded set_mode, and the warning torch would emit (its text) raised by hand."""
from __future__ import annotations

import warnings
from types import SimpleNamespace

import pytest
import torch

from scalelab.scaling.device_syncs import MESSAGE, DeviceSyncCounter

pytestmark = pytest.mark.filterwarnings(f"ignore:{MESSAGE}")  # the uncounted steps' warnings


def _trainer(device="cuda"):
    return SimpleNamespace(strategy=SimpleNamespace(root_device=torch.device(device)), global_step=0)


def _torch_sync():
    warnings.warn(MESSAGE)   # what TORCH_WARN turns into when a synchronizing call runs


def _train(counter, trainer, syncs_per_step, other=None):
    counter.on_train_start(trainer, None)
    for step, n in enumerate(syncs_per_step, start=1):
        trainer.global_step = step - 1
        counter.on_train_batch_start(trainer, None, None, step - 1)
        for _ in range(n):
            _torch_sync()
        if other:
            warnings.warn(other)
    counter.on_train_end(trainer, None)


def test_counts_steady_steps_only_with_origin():
    modes = []
    c = DeviceSyncCounter(first=3, last=5, set_mode=modes.append)
    _train(c, _trainer(), [7, 7, 1, 0, 2, 9])   # steps 1-2 warm-up, 6 profiled: not counted
    r = c.result()
    assert r["steps"] == [3, 5] and r["per_step"] == 1.0 and r["max_in_a_step"] == 2
    line = _torch_sync.__code__.co_firstlineno + 1
    [(origin, n)] = r["origins"].items()
    assert origin.endswith(f"tests/unit/test_device_syncs.py:{line} (_torch_sync)") and n == 3
    assert modes == ["warn", "default"]         # on for the steady steps, off after them


def test_other_warnings_still_shown_and_hook_restored():
    shown = []
    before = warnings.showwarning
    c = DeviceSyncCounter(first=1, last=2, set_mode=lambda m: None)
    with warnings.catch_warnings():
        warnings.simplefilter("always")
        warnings.showwarning = lambda *a, **k: shown.append(str(a[0]))
        _train(c, _trainer(), [1, 1], other="something else")
        assert shown == ["something else", "something else"]
        warnings.showwarning = before
    assert warnings.showwarning is before
    assert c.result()["per_step"] == 1.0


def test_nothing_off_cuda():
    modes = []
    c = DeviceSyncCounter(first=1, last=3, set_mode=modes.append)
    _train(c, _trainer("cpu"), [1, 1, 1])
    assert c.result() is None and modes == []

"""pipeline_record.StageTimer: a pipeline rank's step time and compute time per optimizer step,
from which run.json's measured bubble comes. On CUDA from events read two steps late (fake events
here, their device times set by hand); on CPU from perf_counter."""
from __future__ import annotations

import pytest
import torch

from scalelab.strategies import pipeline_record
from scalelab.strategies.pipeline_record import StageTimer


class FakeEvent:
    """A recorded CUDA event: `at` is when the stream reached it (ms)."""
    clock = [0.0]
    waited: list = []

    def __init__(self):
        self.at = FakeEvent.clock[0]

    def elapsed_time(self, end) -> float:
        return end.at - self.at

    def synchronize(self) -> None:
        FakeEvent.waited.append(self.at)


def _step(timer, calls_ms, idle_ms):
    """One schedule step: idle_ms before each call, then the call itself taking calls_ms[i]."""
    timer.start_step()
    for c, i in zip(calls_ms, idle_ms):
        FakeEvent.clock[0] += i
        timer.wrap(lambda c=c: FakeEvent.clock.__setitem__(0, FakeEvent.clock[0] + c))()
    timer.end_step()


def test_cuda_intervals_read_two_steps_late_without_draining():
    FakeEvent.clock, FakeEvent.waited = [0.0], []
    t = StageTimer(torch.device("cuda", 0), event=FakeEvent)
    _step(t, [4.0, 6.0], [1.0, 3.0])      # step 1: 14 ms, 10 ms of it in the calls
    _step(t, [5.0], [0.0])                # step 2: 5 ms, all compute
    assert FakeEvent.waited == [] and t.step_s == []    # nothing read yet: no wait at all
    _step(t, [2.0, 2.0], [2.0, 2.0])      # step 3 ends: step 1 is read, after its own end event
    assert FakeEvent.waited == [14.0]
    assert t.step_s == pytest.approx([0.014]) and t.busy_s == pytest.approx([0.010])
    step_s, busy_s = t.results()          # the end of training reads the rest
    assert step_s == pytest.approx([0.014, 0.005, 0.008]) and busy_s == pytest.approx([0.010, 0.005, 0.004])


def test_cpu_uses_host_time(monkeypatch):
    now = [100.0]
    monkeypatch.setattr(pipeline_record.time, "perf_counter", lambda: now[0])
    t = StageTimer(torch.device("cpu"))
    t.start_step()
    now[0] += 0.5                                     # waiting for a receive
    t.wrap(lambda: now.__setitem__(0, now[0] + 1.5))()
    now[0] += 0.25
    t.end_step()
    assert t.results() == ([pytest.approx(2.25)], [pytest.approx(1.5)])

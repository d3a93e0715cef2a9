"""LiveThroughput: Lightning's ThroughputMonitor without the torch.cuda.synchronize() it calls
after every training batch on a CUDA rank (results/throughput_live.py). Checked on CPU with a
trainer whose root device says "cuda" and a synchronize that records its calls."""
from __future__ import annotations

from types import SimpleNamespace

import pytest
import torch
from lightning.pytorch.callbacks import ThroughputMonitor
from lightning.pytorch.trainer.states import RunningStage

from scalelab.results.throughput_live import LiveThroughput


class _Throughput:
    def __init__(self):
        self.updates = []

    def update(self, **kw):
        self.updates.append(kw)


def _cuda_trainer():
    return SimpleNamespace(state=SimpleNamespace(stage=RunningStage.TRAINING),
                           strategy=SimpleNamespace(root_device=torch.device("cuda", 0)))


@pytest.fixture
def syncs(monkeypatch):
    calls = []
    monkeypatch.setattr(torch.cuda, "synchronize", lambda *a, **k: calls.append(a))
    return calls


def _monitor(cls):
    m = cls(batch_size_fn=lambda b: b.shape[0], length_fn=lambda b: b.numel())
    stage = RunningStage.TRAINING
    m._throughputs[stage] = _Throughput()
    m._t0s[stage], m._lengths[stage], m._samples[stage], m._batches[stage] = 0.0, 0, 0, 0
    return m


def test_lightning_monitor_syncs_every_batch(syncs):
    """The premise: Lightning's own callback synchronizes a CUDA rank after each batch."""
    m = _monitor(ThroughputMonitor)
    for i in range(3):
        m._update(_cuda_trainer(), SimpleNamespace(flops_per_batch=10), torch.zeros(4, 8), i + 1)
    assert len(syncs) == 3


def test_live_monitor_counts_the_same_without_syncing(syncs):
    m = _monitor(LiveThroughput)
    for i in range(3):
        m._update(_cuda_trainer(), SimpleNamespace(flops_per_batch=10), torch.zeros(4, 8), i + 1)
    assert syncs == []
    last = m._throughputs[RunningStage.TRAINING].updates[-1]
    assert (last["batches"], last["samples"], last["lengths"], last["flops"]) == (3, 12, 96, 10)
    assert torch.cuda.synchronize is not None and len(syncs) == 0
    torch.cuda.synchronize()  # restored after each update: the patched recorder is back in place
    assert len(syncs) == 1


def test_global_samples_count_each_sample_once_under_tensor_parallel():
    """tp=4 at world 4 (one data-parallel replica): 16 samples/s on each device is 16 for the job,
    not 4 x 16 (Lightning multiplies by the world size); dp=2 x tp=2: 2 x 16."""
    from lightning.pytorch.plugins.precision import Precision
    from lightning.pytorch.trainer.states import TrainerFn

    def logged(world, replicas):
        m = LiveThroughput(batch_size_fn=lambda b: b.shape[0], window_size=2, replicas=replicas)
        trainer = SimpleNamespace(state=SimpleNamespace(stage=RunningStage.TRAINING), world_size=world,
                                  enable_validation=False, precision_plugin=Precision(),
                                  strategy=SimpleNamespace(root_device=torch.device("cpu")))
        m.setup(trainer, None, TrainerFn.FITTING)
        t = m._throughputs[RunningStage.TRAINING]
        for i in (1, 2):                          # 4 samples of 8 items per 0.25 s
            t.update(time=0.25 * i, batches=i, samples=4 * i, lengths=32 * i)
        return t.compute()

    tp4 = logged(4, 4)
    assert tp4["device/samples_per_sec"] == 16 and tp4["samples_per_sec"] == 16 and tp4["items_per_sec"] == 128
    assert logged(4, 2)["samples_per_sec"] == 32 and logged(4, 1)["samples_per_sec"] == 64   # dp 2; plain ddp
    # one rank: the job's figures are the device's (Lightning logged device/* only: review 2026-12-04)
    one = logged(1, 1)
    assert (one["samples_per_sec"], one["items_per_sec"], one["batches_per_sec"]) == (16, 128, 4)

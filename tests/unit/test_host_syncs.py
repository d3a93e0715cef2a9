"""No host<->device sync per training step from the platform (issue 11: `single` ran 0.92 of a
hand-written loop on an H200, the device idle ~4 ms/step more).

On CUDA a host read of a device value drains the device queue; a hand-written loop does none
per step. tests/host_syncs.py's SyncDetector sees those reads on CPU (a TorchDispatchMode plus
wrappers on Tensor.tolist/cpu/numpy and torch.cuda's synchronize calls, each with its stack).
The run test drives scalelab.worker.run (the real Lightning loop and the platform's callbacks,
the SLURM requeue one included) in this process; the others check the CUDA-only code paths
(lagged reads, LearningRateMonitor) with fake events and devices; the ThroughputMonitor's
per-batch torch.cuda.synchronize() is removed in results/throughput_live.py (tests/unit/test_throughput_live.py).
"""
from __future__ import annotations

import collections
import csv
import signal
from types import SimpleNamespace

import pytest
import torch

from scalelab.scaling import metrics
from scalelab.scaling.metrics import HostLRMonitor, LaggedReads

from ..host_syncs import SyncDetector, run_job, step_tagger, write_job

STEPS, WARMUP = 10, 3
# A SLURM batch job's rank (worker.py: SLURMEnvironment plugin + RequeueOnSignal)
SLURM_RANK = {"SCALELAB_SLURM_STEP": "1", "SLURM_JOB_ID": "4242", "SLURM_NTASKS": "1", "SLURM_PROCID": "0",
              "SLURM_LOCALID": "0", "SLURM_NODEID": "0", "SLURM_JOB_NAME": "host-syncs"}


def _frames(hit) -> list[tuple[str, str]]:
    return [(f.filename.replace("\\", "/"), f.name) for f in hit.stack]


def _in(hit, path_part: str, func: str | None = None) -> bool:
    return any(path_part in fn and (func is None or name == func) for fn, name in _frames(hit))


def test_detector_sees_each_kind_of_host_read():
    t = torch.arange(4.0)
    with SyncDetector() as d:
        t.sum().item()
        bool(t[0])
        float(t.max())
        t.tolist()
        t.cpu()
        torch.equal(t, t)
        t.nonzero()
        t[t > 1]
        torch.tensor([1.0])          # torch.tensor(data, device=cuda) is a blocking H2D copy
        t * 2 + 1                    # no read
    kinds = collections.Counter(h.what for h in d.hits)
    assert kinds == {"aten._local_scalar_dense": 3, "Tensor.tolist": 1, "Tensor.cpu": 1, "aten.equal": 1,
                     "aten.nonzero": 1, "aten.index": 1, "aten.lift_fresh": 1}
    assert all(h.origin().startswith("tests/unit/test_host_syncs.py") for h in d.hits)


def test_single_job_steady_steps_have_no_host_syncs(tmp_path):
    """strategy=single on CPU, logger=csv (so LearningRateMonitor and the logger path are on),
    progress bar on, periodic checkpoints on, under a (fake) SLURM batch job (RequeueOnSignal):
    every read the steady steps make is listed below with why it is no device sync; any other
    one fails the test with its stack (checked: `loss.item()` added to training_step or to
    StepMetrics.on_train_batch_end, the loss logged with Lightning's `self.log(..., prog_bar=True)`
    again, or the requeue flag read with `flag.item()` again: each fails here)."""
    job = write_job(tmp_path / "job", ["strategy=single", "model=gpt_nano", "logger=csv", "trainer.accelerator=cpu",
                                       f"trainer.max_steps={STEPS}", f"trainer.warmup_steps={WARMUP}",
                                       "trainer.profile_steps=0", "trainer.enable_progress_bar=true",
                                       "checkpoint.every_n_steps=1000", "data.global_batch_size=4"])
    det, seen = SyncDetector(), []   # seen: the Trainer's callbacks
    tagger = step_tagger(det)
    orig_start = tagger.on_train_start

    def on_train_start(trainer, pl_module):
        seen.extend(trainer.callbacks)
        orig_start(trainer, pl_module)

    tagger.on_train_start = on_train_start
    usr1 = signal.getsignal(signal.SIGUSR1)
    record = run_job(job, [tagger], env=SLURM_RANK)
    assert signal.getsignal(signal.SIGUSR1) == usr1
    assert record["status"] == "completed" and record["steps"] == STEPS
    assert any(type(c).__name__ == "_Requeue" for c in seen)      # the SLURM requeue callback ran

    n_param_tensors = sum(1 for _ in torch.nn.Module.parameters(_net(job)))
    for step, hits in det.per_step(WARMUP + 1, STEPS - 1).items():   # the last step flushes the loggers
        left = []
        counts = collections.Counter()
        for h in hits:
            if h.what == "aten._local_scalar_dense" and _in(h, "torch/optim/", "_get_value"):
                # torch's single-tensor Adam (its CPU default) reads each parameter's step counter,
                # a CPU tensor; on CUDA torch uses foreach (CPU counters too) or fused (counters
                # read on the device): no device read either way.
                counts["adam step counters"] += 1
            elif h.what == "Tensor.tolist" and _in(h, "src/scalelab/data/sampler.py", "__iter__"):
                counts["sampler indices"] += 1        # a CPU permutation in every run: host only
            elif h.what == "aten.lift_fresh" and _in(h, "src/scalelab/data/datamodule.py", "__getitem__"):
                counts["dataset samples"] += 1        # the data loader builds host tensors
            elif h.what == "aten._local_scalar_dense" and _in(h, "src/scalelab/requeue.py", "on_train_batch_end"):
                # RequeueOnSignal's flag: a host tensor all-reduced over gloo (a gloo group of the
                # ranks on an NCCL job): read from host memory on CUDA too
                counts["requeue host flag"] += 1
            elif h.what == "Tensor.tolist" and _in(h, "src/scalelab/scaling/metrics.py", "read_host"):
                # LaggedReads: on CPU read at once; on CUDA a pinned host copy read LAG_STEPS late,
                # after its own event: no device read. One for the logged loss (and the progress
                # bar's, once per print).
                who = "bar" if _in(h, "src/scalelab/console.py") else "loss" if _in(h, "src/scalelab/models/lit.py") \
                    else "?"
                counts[f"lagged reads {who}"] += 1
            elif h.what == "aten.lift_fresh" and _in(h, "src/scalelab/scaling/metrics.py", "_extract_stats"):
                # HostLRMonitor's copies of the LR into callback_metrics: CPU tensors on CUDA too
                # (test_lr_monitor_logs_the_same_values_without_device_tensors)
                counts["lr monitor host tensors"] += 1
            else:
                left.append(h)
        assert not left, f"step {step}: host syncs\n" + "\n".join(f"{h.what} from {h.origin()}\n{h.where(12)}"
                                                                   for h in left)
        assert counts["adam step counters"] == n_param_tensors
        assert counts["sampler indices"] == 1 and counts["dataset samples"] == 4   # batch 4, one micro-batch
        assert counts["lagged reads loss"] == counts["requeue host flag"] == 1
        assert counts["lagged reads bar"] <= 1 and not counts["lagged reads ?"]


def _net(job):
    from omegaconf import OmegaConf

    from scalelab.config import validate
    from scalelab.models.build import build_net

    return build_net(validate(OmegaConf.load(job / "config_resolved.yaml")).run.model_arch)


# ---- the CUDA paths, with fake events ------------------------------------------------------------
class FakeEvent:
    log: list = []

    def __init__(self, tag):
        self.tag = tag

    def synchronize(self):
        FakeEvent.log.append(self.tag)


def _fake_cuda_copy(value):
    """host_copy as on CUDA: a host tensor and an event that has not been waited on."""
    return value.detach().clone(), FakeEvent(int(value.reshape(-1)[0]))


def test_lagged_reads_wait_only_on_old_events():
    FakeEvent.log = []
    r = LaggedReads(lag=2, copy=_fake_cuda_copy)
    assert r.push("s1", torch.tensor([10])) == [] and r.push("s2", torch.tensor([20])) == []
    assert FakeEvent.log == []                                  # nothing waited on yet
    assert r.push("s3", torch.tensor([30])) == [("s1", [10])]
    assert FakeEvent.log == [10]                                # the event of s1 only, not of s2, s3
    assert r.push("s4", torch.tensor([40])) == [("s2", [20])] and FakeEvent.log == [10, 20]
    assert r.drain() == [("s3", [30]), ("s4", [40])] and len(r) == 0
    # off CUDA (no event): read at once
    assert LaggedReads(lag=2).push("cpu", torch.tensor([7])) == [("cpu", [7])]


def _requeue_ranks(tmp_path, n: int):
    from scalelab.requeue import RequeueOnSignal

    class Saver:
        def __init__(self):
            self.saved = []

        def save(self, trainer, step):
            self.saved.append(step)
            return tmp_path / f"step-{step}.ckpt"

        def saved_at(self, step):   # no periodic save ran at the signalled step here
            return None

    ranks = []
    for r in range(n):
        cb = RequeueOnSignal(tmp_path, Saver())
        trainer = SimpleNamespace(global_step=0, max_steps=100, should_stop=False, is_global_zero=r == 0,
                                  strategy=SimpleNamespace(root_device=torch.device("cpu")))
        ranks.append((cb, trainer))
    return ranks


def _fake_all_reduce(ranks, monkeypatch, backend="gloo", calls=None):
    """dist.all_reduce(MAX) across the fake ranks: every rank gets the max of their flags."""
    import torch.distributed as dist

    def all_reduce(t, op=None, group=None):
        if calls is not None:
            calls.append((t.device.type, group))
        return t.fill_(max(cb.signalled or 0 for cb, _ in ranks))

    monkeypatch.setattr(dist, "is_initialized", lambda: True)
    monkeypatch.setattr(dist, "get_backend", lambda group=None: backend)
    monkeypatch.setattr(dist, "new_group", lambda backend=None, **k: f"{backend} group")
    monkeypatch.setattr(dist, "all_reduce", all_reduce)


def _steps(ranks, signal_at: int, rank: int, last: int = 20):
    for cb, trainer in ranks:
        cb.on_train_start(trainer, None)
    for step in range(1, last + 1):
        if step == signal_at:
            ranks[rank][0].signalled = int(signal.SIGUSR1)
        for cb, trainer in ranks:
            trainer.global_step = step
            cb.on_train_batch_end(trainer, None, None, None, step - 1)
        if any(t.should_stop for _, t in ranks):
            return step
    return None


@pytest.mark.parametrize("backend", ["gloo", "nccl"])
def test_requeue_stops_every_rank_at_the_signalled_step_from_a_host_flag(tmp_path, monkeypatch, backend):
    """The flag is a host tensor all-reduced over gloo: the default group of a CPU job, a gloo group
    of the same ranks made at train start on an NCCL job (a CUDA rank's root device here), so the
    read is of host memory; both ranks stop and save at the step the signal arrived in."""
    import signal as _signal

    saved = {s: _signal.getsignal(s) for s in (_signal.SIGUSR1, _signal.SIGTERM)}
    ranks = _requeue_ranks(tmp_path, 2)
    for _, trainer in ranks:
        trainer.strategy.root_device = torch.device("cuda", 0) if backend == "nccl" else torch.device("cpu")
    calls: list = []
    _fake_all_reduce(ranks, monkeypatch, backend, calls)
    try:
        assert _steps(ranks, signal_at=5, rank=1) == 5
    finally:
        for s, h in saved.items():
            _signal.signal(s, h)
    assert [cb.stopped_at for cb, _ in ranks] == [5, 5] and [cb.saver.saved for cb, _ in ranks] == [[5], [5]]
    assert (tmp_path / ".preempted").read_text() == "5 SIGUSR1"
    assert set(calls) == {("cpu", None if backend == "gloo" else "gloo group")}


def test_requeue_saves_whole_steps_after_a_resume_with_accumulation(tmp_path, monkeypatch):
    """Resumed at step 4 with 2 micro-batches per step and a warning signal already noted while the
    rank started (requeue.EARLY): the first micro-batch still reports step 4; the save must wait for
    step 5's end (it saved step 4 again, mid-step). A SIGTERM Lightning's handler took before
    RequeueOnSignal's is picked up too, instead of stopping this rank alone without a save."""
    import signal as _signal

    from scalelab import requeue

    saved = {s: _signal.getsignal(s) for s in (_signal.SIGUSR1, _signal.SIGTERM)}
    ranks = _requeue_ranks(tmp_path, 1)
    cb, trainer = ranks[0]
    trainer.global_step = 4
    _fake_all_reduce(ranks, monkeypatch)
    monkeypatch.setattr(requeue, "EARLY", [int(_signal.SIGUSR1)])
    try:
        cb.on_train_start(trainer, None)
        cb.on_train_batch_end(trainer, None, None, None, 0)      # micro-batch 1 of step 5: still step 4
        assert cb.saver.saved == [] and not trainer.should_stop
        trainer.global_step = 5
        cb.on_train_batch_end(trainer, None, None, None, 1)      # step 5 done
        assert cb.saver.saved == [5] and trainer.should_stop
        cb2, t2 = _requeue_ranks(tmp_path, 1)[0]
        t2.received_sigterm = True
        t2._signal_connector = SimpleNamespace(received_sigterm=True)
        monkeypatch.setattr(requeue, "EARLY", [])
        cb2.on_train_start(t2, None)
        assert cb2.signalled == _signal.SIGTERM and t2._signal_connector.received_sigterm is False
    finally:
        for s, h in saved.items():
            _signal.signal(s, h)


# ---- Lightning callbacks' CUDA branches -----------------------------------------------------------
def test_lr_monitor_logs_the_same_values_without_device_tensors():
    from lightning.pytorch.callbacks import LearningRateMonitor
    from lightning.pytorch.utilities.types import LRSchedulerConfig

    net = torch.nn.Linear(2, 2)
    opt = torch.optim.AdamW(net.parameters(), lr=0.25)
    sched = torch.optim.lr_scheduler.LambdaLR(opt, lambda s: 0.5)

    def trainer():
        return SimpleNamespace(lr_scheduler_configs=[LRSchedulerConfig(sched, interval="step")], optimizers=[opt],
                               loggers=[object()], callback_metrics={},
                               strategy=SimpleNamespace(root_device=torch.device("cuda", 0)))

    t = trainer()
    host = HostLRMonitor("step")
    host.on_train_start(t)
    assert host._extract_stats(t, "step") == {"lr-AdamW": 0.125}
    assert t.callback_metrics["lr-AdamW"].device.type == "cpu" and float(t.callback_metrics["lr-AdamW"]) == 0.125
    stock, t2 = LearningRateMonitor("step"), trainer()
    stock.on_train_start(t2)
    if torch.cuda.is_available():   # the premise: Lightning's own monitor makes a CUDA tensor per step
        stock._extract_stats(t2, "step")
        assert t2.callback_metrics["lr-AdamW"].device.type == "cuda"
    else:                           # ... which a torch without CUDA refuses to make
        with pytest.raises((AssertionError, RuntimeError)):
            stock._extract_stats(t2, "step")


def test_logged_loss_rows_are_the_same_when_read_lag_steps_late(tmp_path, monkeypatch):
    """LitModule logs train/loss to the loggers LAG_STEPS logged steps late on CUDA: the CSV rows
    (step, epoch, train/loss) are those Lightning's own self.log wrote, all of them (the last ones
    at the end), with gradient accumulation."""
    import lightning as L
    from lightning.pytorch.loggers import CSVLogger

    from scalelab.models.gpt import GPTConfig
    from scalelab.models.lit import LitModule

    class LightningLogged(LitModule):
        """The reference: the loss logged as before, with Lightning's own self.log."""

        def log_loss(self, loss):
            self.log("train/loss", loss, prog_bar=True, on_step=True, on_epoch=False)

        def on_train_batch_end(self, *a):
            pass

        def on_train_end(self):
            pass

    def fit(name, cls=LitModule):
        L.seed_everything(0, verbose=False)
        arch = GPTConfig(n_layers=1, n_heads=2, d_model=16, seq_len=8, vocab_size=32)
        module = cls(arch, "lm", lambda params, lr: torch.optim.SGD(params, lr=lr), 0.1, 7, 0, "constant", 0.1)
        data = torch.utils.data.DataLoader(torch.randint(0, 32, (64, 9)), batch_size=4)
        L.Trainer(max_steps=7, logger=CSVLogger(tmp_path, name=name, version=""), enable_progress_bar=False,
                  enable_checkpointing=False, enable_model_summary=False, log_every_n_steps=1,
                  accumulate_grad_batches=2).fit(module, data)
        with open(tmp_path / name / "metrics.csv") as f:
            return sorted((r["step"], r["epoch"], r["train/loss"]) for r in csv.DictReader(f) if r["train/loss"])

    reference = fit("lightning", LightningLogged)
    immediate = fit("immediate")
    FakeEvent.log = []
    monkeypatch.setattr(metrics, "host_copy", _fake_cuda_copy)
    lagged = fit("lagged")
    assert len(reference) == 7 and immediate == reference and lagged == reference
    assert len(FakeEvent.log) == 7          # each step's own event, waited on once

"""A resumed run trains on exactly the global batches the uninterrupted run would have, step for
step, across epoch boundaries: the platform's data module and sampler, Lightning's fit loop and
the platform's periodic checkpoint, on a corpus whose every block is tagged (block i starts with
two letters naming i). 40 blocks, global batch 4: 10 optimizer steps per epoch, 25 steps run.

Found broken (before sampler.__len__ covered the whole epoch and datamodule.align_epoch_progress):
a resume at step 3 skipped steps 8-10 of epoch 0 and the last 3 steps of every later epoch; a
last.ckpt written at an epoch's last step stepped once on half a batch; a resume with another
accumulation count (another world size at the same micro-batch) straddled two global batches in
every step."""
from __future__ import annotations

import lightning as L
import pytest
import torch

from scalelab.checkpointing import periodic_checkpoint
from scalelab.data.datamodule import ByteCorpusDataModule
from scalelab.data.prepare import prepare

SEQ, BLOCKS, BATCH, STEPS = 7, 40, 4, 25


@pytest.fixture(scope="module")
def prepared(tmp_path_factory):
    root = tmp_path_factory.mktemp("tagged")
    text = root / "corpus.txt"
    # block i (SEQ+1 bytes: blocks overlap by one byte) = its tag "Xy" four times
    tags = [bytes([65 + i % 26, 97 + i // 26]) for i in range(BLOCKS + 1)]
    text.write_bytes(b"".join(t * 4 for t in tags)[:-1])
    return prepare({"source": "files", "files": [str(text)], "val_fraction": 0.0}, SEQ, root / "cache", progress=False)


class Stop(Exception):
    pass


class Tagged(L.LightningModule):
    """Records the tags of every sample each optimizer step trains on."""

    def __init__(self, stop_at=None):
        super().__init__()
        self.lin, self.stop_at, self.seen = torch.nn.Linear(SEQ + 1, 1), stop_at, {}

    def training_step(self, batch, i):
        step = self.seen.setdefault(int(self.trainer.global_step) + 1, [])
        step.extend(bytes(row[:2].tolist()).decode() for row in batch)
        return self.lin(batch.float()).mean()

    def on_train_batch_end(self, *args):
        if self.stop_at is not None and self.trainer.global_step >= self.stop_at:
            raise Stop()           # a crash after the periodic checkpoint of this step

    def configure_optimizers(self):
        return torch.optim.SGD(self.parameters(), lr=1e-3)


def fit(prepared, job, micro, max_steps=STEPS, stop_at=None, ckpt=None, every=None):
    job.mkdir(parents=True, exist_ok=True)
    module = Tagged(stop_at)
    trainer = L.Trainer(accelerator="cpu", devices=1, max_steps=max_steps, max_epochs=-1,
                        accumulate_grad_batches=BATCH // micro, logger=False, enable_checkpointing=False,
                        enable_progress_bar=False, enable_model_summary=False, use_distributed_sampler=False,
                        num_sanity_val_steps=0, limit_val_batches=0,
                        callbacks=[periodic_checkpoint(job, every, 5)] if every else [])
    try:
        trainer.fit(module, datamodule=ByteCorpusDataModule(prepared, BATCH, micro, 0, 1, seed=1), ckpt_path=ckpt)
    except Stop:
        pass
    return module.seen, trainer


@pytest.fixture(scope="module")
def reference(prepared, tmp_path_factory):
    seen, _ = fit(prepared, tmp_path_factory.mktemp("ref"), micro=2)
    assert sorted(seen) == list(range(1, STEPS + 1))
    epoch0 = [tag for s in range(1, 11) for tag in seen[s]]
    assert len(set(epoch0)) == BLOCKS          # an epoch is every block once (the tags can tell)
    return seen


@pytest.mark.parametrize("stop_at,micro_before,micro_after", [
    (3, 2, 2),       # mid-epoch: the rest of epoch 0, then whole epochs
    (6, 2, 2),       # past half an epoch
    (3, 2, 1),       # accumulation 2 -> 4 (the same micro-batch at half the world size)
    (3, 1, 2),       # accumulation 4 -> 2
])
def test_a_resume_from_a_periodic_checkpoint_continues_the_same_batches(prepared, reference, tmp_path,
                                                                        stop_at, micro_before, micro_after):
    fit(prepared, tmp_path / "job", micro_before, stop_at=stop_at, every=stop_at)
    (ckpt,) = (tmp_path / "job" / "checkpoints").glob("step-*.ckpt")
    resumed, trainer = fit(prepared, tmp_path / "job", micro_after, ckpt=str(ckpt))
    assert trainer.global_step == STEPS
    assert sorted(resumed) == list(range(stop_at + 1, STEPS + 1))
    wrong = [s for s in resumed if sorted(resumed[s]) != sorted(reference[s])]
    assert not wrong, f"steps {wrong} trained on other samples than the uninterrupted run's"


@pytest.mark.parametrize("first_max", [6, 10])   # 10: stopped at the last step of epoch 0
def test_train_it_longer_from_the_last_checkpoint_continues_the_same_batches(prepared, reference, tmp_path,
                                                                              first_max):
    _, first = fit(prepared, tmp_path / "a", micro=2, max_steps=first_max)
    first.save_checkpoint(str(tmp_path / "last.ckpt"))     # what checkpoint.save writes after fit
    resumed, trainer = fit(prepared, tmp_path / "b", micro=2, ckpt=str(tmp_path / "last.ckpt"))
    assert trainer.global_step == STEPS and sorted(resumed) == list(range(first_max + 1, STEPS + 1))
    wrong = [s for s in resumed if sorted(resumed[s]) != sorted(reference[s])]
    assert not wrong, f"steps {wrong} trained on other samples than the uninterrupted run's"


class LRs(L.Callback):
    def __init__(self):
        self.at = {}

    def on_train_batch_start(self, trainer, module, batch, i):
        self.at[int(trainer.global_step) + 1] = trainer.optimizers[0].param_groups[0]["lr"]


def fit_lm(prepared, job, max_steps, stop_at=None, ckpt=None, warmup=0.1):
    """The platform's LitModule (cosine decay after a 10 % warmup) on a 1-layer GPT."""
    from scalelab.models.gpt import GPTConfig
    from scalelab.models.lit import LitModule

    class Stopping(LitModule):
        def on_train_batch_end(self, *args):
            if stop_at is not None and self.trainer.global_step >= stop_at:
                raise Stop()

    job.mkdir(parents=True, exist_ok=True)
    torch.manual_seed(0)
    module = Stopping(GPTConfig(n_layers=1, n_heads=2, d_model=16, seq_len=SEQ, vocab_size=256), "lm",
                      torch.optim.SGD, 1.0, max_steps, warmup, "cosine", 0.1)
    lrs = LRs()
    trainer = L.Trainer(accelerator="cpu", devices=1, max_steps=max_steps, max_epochs=-1, logger=False,
                        enable_checkpointing=False, enable_progress_bar=False, enable_model_summary=False,
                        use_distributed_sampler=False, num_sanity_val_steps=0, limit_val_batches=0,
                        callbacks=[lrs] + ([periodic_checkpoint(job, stop_at, 5)] if stop_at else []))
    try:
        trainer.fit(module, datamodule=ByteCorpusDataModule(prepared, BATCH, BATCH, 0, 1, seed=1), ckpt_path=ckpt)
    except Stop:
        pass
    return lrs.at


def test_a_run_trained_longer_follows_its_own_lr_schedule(prepared, tmp_path):
    """max_steps 20 -> 40, resumed at 12: steps 13-40 use the 40-step schedule, the LRs a fresh
    40-step run uses (cosine from 1.0 to 0.1 after 4 warmup steps), not the 20-step one's
    restored state (whose cosine ends at step 20 and climbs back after it)."""
    fresh = fit_lm(prepared, tmp_path / "fresh", 40)
    fit_lm(prepared, tmp_path / "job", 20, stop_at=12)
    (ckpt,) = (tmp_path / "job" / "checkpoints").glob("step-*.ckpt")
    resumed = fit_lm(prepared, tmp_path / "job", 40, ckpt=str(ckpt))
    assert sorted(resumed) == list(range(13, 41))
    # by hand: step s >= 5 trains at 0.1 + 0.9 (1 + cos(pi (s - 5) / 35)) / 2 (the last, 40, at 0.1)
    import math
    for s in (13, 23, 40):
        assert fresh[s] == pytest.approx(0.1 + 0.45 * (1 + math.cos(math.pi * (s - 5) / 35)))
    assert fresh[40] == pytest.approx(0.1)
    assert [resumed[s] for s in range(13, 41)] == pytest.approx([fresh[s] for s in range(13, 41)])


def test_each_rank_draws_its_own_dropout_masks():
    """Every rank seeds alike before the model is built (the same weights everywhere); training
    then draws per rank: two ranks' masks differ, and a rank's masks repeat with the seed."""
    from types import SimpleNamespace

    from scalelab.models.lit import RankRandomness

    def masks(seed, rank, step=0):
        torch.manual_seed(seed)              # what seed_everything left every rank with
        RankRandomness(seed).on_train_batch_start(SimpleNamespace(global_rank=rank, global_step=step), None, None, 0)
        return torch.nn.functional.dropout(torch.ones(64), 0.5).ne(0).tolist()

    assert masks(1, 0) != masks(1, 1) and masks(1, 1) != masks(1, 2)
    assert masks(1, 1) == masks(1, 1) and masks(2, 1) != masks(1, 1)
    assert masks(1, 1, step=30) != masks(1, 1)      # a resumed run does not repeat its first masks


class Masks(Tagged):
    """Records the dropout mask each micro-batch of each optimizer step draws."""

    def training_step(self, batch, i):
        mask = torch.nn.functional.dropout(torch.ones(32), 0.5).ne(0).tolist()
        self.seen.setdefault(int(self.trainer.global_step) + 1, []).append(mask)
        return self.lin(batch.float()).mean()


@pytest.mark.parametrize("stop_at", [3, 10])     # 10: the last step of epoch 0
def test_a_resumed_run_draws_the_uninterrupted_runs_dropout_masks(prepared, tmp_path, stop_at):
    """Two micro-batches a step (accumulation 2). Before (one seeding at the start of training, from
    the step), a run resumed at step 3 drew other masks than the uninterrupted run from step 4 on."""
    from scalelab.models.lit import RankRandomness

    def run(job, max_steps=STEPS, stop=None, ckpt=None):
        job.mkdir(parents=True, exist_ok=True)
        torch.manual_seed(1)
        module = Masks(stop)
        trainer = L.Trainer(accelerator="cpu", devices=1, max_steps=max_steps, max_epochs=-1, accumulate_grad_batches=2,
                            logger=False, enable_checkpointing=False, enable_progress_bar=False,
                            enable_model_summary=False, use_distributed_sampler=False, num_sanity_val_steps=0,
                            limit_val_batches=0, callbacks=[RankRandomness(1)]
                            + ([periodic_checkpoint(job, stop, 5)] if stop else []))
        try:
            trainer.fit(module, datamodule=ByteCorpusDataModule(prepared, BATCH, 2, 0, 1, seed=1), ckpt_path=ckpt)
        except Stop:
            pass
        return module.seen

    fresh = run(tmp_path / "fresh")
    assert all(len(fresh[s]) == 2 and fresh[s][0] != fresh[s][1] for s in fresh)   # each micro-batch its own
    run(tmp_path / "job", stop=stop_at)
    (ckpt,) = (tmp_path / "job" / "checkpoints").glob("step-*.ckpt")
    resumed = run(tmp_path / "job", ckpt=str(ckpt))
    assert sorted(resumed) == list(range(stop_at + 1, STEPS + 1))
    wrong = [s for s in resumed if resumed[s] != fresh[s]]
    assert not wrong, f"steps {wrong} drew other dropout masks than the uninterrupted run's"


@pytest.fixture(scope="module")
def with_val(tmp_path_factory):
    root = tmp_path_factory.mktemp("with_val")
    text = root / "corpus.txt"
    text.write_bytes((bytes(range(65, 91)) * 8)[:201])     # 25 blocks: 5 val, 20 train
    return prepare({"source": "files", "files": [str(text)], "val_fraction": 0.2}, SEQ, root / "cache", progress=False)


class Validating(Tagged):
    def __init__(self):
        super().__init__()
        self.validated_at = []

    def validation_step(self, batch, i):
        return None

    def on_validation_end(self):
        self.validated_at.append(int(self.trainer.global_step))


@pytest.mark.parametrize("first_max", [4, 5])
def test_validation_keeps_its_steps_after_a_resume(with_val, tmp_path, first_max):
    """Validation every 2 optimizer steps (val_check_interval counts every batch, as the worker
    sets it) is at steps 2, 4, 6, ... in a resumed run too, also from a last.ckpt written at an
    epoch's last step (5 steps per epoch here: 20 train blocks, batch 4)."""
    def run(job, max_steps, ckpt=None):
        module = Validating()
        trainer = L.Trainer(accelerator="cpu", devices=1, max_steps=max_steps, max_epochs=-1,
                            accumulate_grad_batches=2, logger=False, enable_checkpointing=False,
                            enable_progress_bar=False, enable_model_summary=False, use_distributed_sampler=False,
                            num_sanity_val_steps=0, val_check_interval=2 * 2, check_val_every_n_epoch=None,
                            limit_val_batches=1)
        trainer.fit(module, datamodule=ByteCorpusDataModule(with_val, BATCH, 2, 0, 1, seed=1), ckpt_path=ckpt)
        return module, trainer

    _, first = run(tmp_path / "a", first_max)
    assert first.num_training_batches == 10          # 5 steps x 2 micro-batches: the epoch is 5 steps
    first.save_checkpoint(str(tmp_path / "last.ckpt"))
    resumed, _ = run(tmp_path / "b", 12, ckpt=str(tmp_path / "last.ckpt"))
    assert resumed.validated_at == [s for s in range(2, 13, 2) if s > first_max]


def test_a_run_trained_longer_with_a_warmup_now_resumes(prepared, tmp_path):
    """A 0-warmup run saved a bare cosine's state, which the warmup + cosine chain of the longer
    run could not load (KeyError '_schedulers'): steps 13-40 follow the fresh 40-step schedule."""
    fresh = fit_lm(prepared, tmp_path / "fresh", 40)
    fit_lm(prepared, tmp_path / "job", 20, stop_at=12, warmup=0)
    (ckpt,) = (tmp_path / "job" / "checkpoints").glob("step-*.ckpt")
    resumed = fit_lm(prepared, tmp_path / "job", 40, ckpt=str(ckpt))
    assert [resumed[s] for s in range(13, 41)] == pytest.approx([fresh[s] for s in range(13, 41)])


def test_a_checkpoint_of_the_earlier_schedule_shape_resumes_onto_this_one(prepared, tmp_path):
    """A checkpoint saved before the schedule's shape changed (warm-up k at 1/n + ..., cosine's
    minimum one step after the run: T = max_steps - warm-up) records the same max_steps, warm-up,
    decay and LR: it was taken for this run's schedule and its restored state kept the old cosine
    (a 20-step run ended at 0.107x, not 0.1x). Its shape is in the record now: it is followed."""
    fresh = fit_lm(prepared, tmp_path / "fresh", 20)
    fit_lm(prepared, tmp_path / "job", 20, stop_at=12)
    (ckpt,) = (tmp_path / "job" / "checkpoints").glob("step-*.ckpt")
    state = torch.load(ckpt, weights_only=False)
    assert state["scalelab_schedule"].pop("schedule_version") == 2       # as an older checkpoint has it
    cosine = state["lr_schedulers"][0]["_schedulers"][1]
    assert cosine["T_max"] == 20 - 2 - 1                                   # 10 % warm-up: 2 steps
    cosine["T_max"] = 20 - 2                                               # the old shape's
    torch.save(state, ckpt)
    resumed = fit_lm(prepared, tmp_path / "job", 20, ckpt=str(ckpt))
    assert [resumed[s] for s in range(13, 21)] == pytest.approx([fresh[s] for s in range(13, 21)])
    assert resumed[20] == pytest.approx(0.1)

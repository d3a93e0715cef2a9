"""LightningDataModule over a prepared byte corpus (see prepare.py), and the validation wiring
(trainer.val_every_n_steps / trainer.val_batches) the worker adds to its Trainer."""
from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import json

import lightning as L
import numpy as np
import pyarrow as pa
import torch
from torch.utils.data import DataLoader, Dataset, Sampler

from scalelab.data.sampler import GlobalBatchSampler


class ByteCorpusDataModule(L.LightningDataModule):
    """Serves (seq_len+1)-token blocks. The data-parallel rank and size come from the strategy
    plan (tensor-parallel peers must see the same samples), not from the global rank."""

    def __init__(self, prepared: str | Path, global_batch: int, micro_batch: int, dp_rank: int,
                 dp_size: int, seed: int, num_workers: int = 0, pin_memory: bool = False):
        super().__init__()
        self.prepared = Path(prepared)
        self.global_batch, self.micro_batch = global_batch, micro_batch
        self.dp_rank, self.dp_size, self.seed, self.num_workers = dp_rank, dp_size, seed, num_workers
        # GPU ranks (worker: accelerator == "gpu"): batches in page-locked memory. Lightning copies
        # a batch with .to(cuda, non_blocking=True); from pageable memory that copy first waits for
        # every kernel already queued on the stream (CUDA's API sync behaviour for pageable
        # host-to-device copies), a device drain per step that exposes the host's per-step work as
        # device idle time. From pinned memory it is queued like a kernel and the host runs ahead.
        self.pin_memory = pin_memory
        self._val_ds = None

    def setup(self, stage: str | None = None) -> None:
        self.train_ds = BlockDataset(self.prepared / "train")

    @property
    def val_ds(self):
        """The val split, loaded when validation first asks for it (there is none at val_fraction 0)."""
        if self._val_ds is None:
            path = self.prepared / "val"
            if not path.exists():
                raise RuntimeError(f"no val split in {self.prepared} (data.val_fraction is 0)")
            self._val_ds = BlockDataset(path)
        return self._val_ds

    def _loader(self, ds, shuffle: bool, start_step: int = 0, lightning_epoch: int | None = None) -> DataLoader:
        sampler = GlobalBatchSampler(len(ds), self.global_batch, self.micro_batch, self.dp_rank,
                                     self.dp_size, self.seed, shuffle=shuffle, start_step=start_step,
                                     lightning_epoch=lightning_epoch)
        return DataLoader(ds, batch_size=self.micro_batch, sampler=sampler, drop_last=True,
                          num_workers=self.num_workers, collate_fn=_collate, pin_memory=self.pin_memory,
                          worker_init_fn=_worker_init if self.num_workers else None,
                          # started once: new workers at every epoch (and validation) cost 5 s inside
                          # the step that began it, p90 step time 5.27 s for a 31 ms median; the
                          # sampler runs in the rank's own process (Lightning's set_epoch reaches it)
                          persistent_workers=self.num_workers > 0)

    def train_dataloader(self) -> DataLoader:
        # After a resume, continue with the global batch the interrupted run would have used next
        # (Lightning restores global_step before it asks for the dataloader).
        step = self.trainer.global_step if self.trainer is not None else 0
        epoch = self.trainer.current_epoch if self.trainer is not None else None
        loader = self._loader(self.train_ds, shuffle=True, start_step=step, lightning_epoch=epoch)
        if self.trainer is not None:
            align_epoch_progress(self.trainer.fit_loop.epoch_loop.batch_progress,
                                 loader.sampler.first * loader.sampler.A, step * loader.sampler.A)
        return loader

    def val_dataloader(self) -> DataLoader:
        """The val split in order, sharded over data-parallel ranks: every rank gets the same
        number of blocks (the split floored to a multiple of dp_size) in micro-batches, the last
        possibly short, so a few val blocks still validate. The Trainer's limit_val_batches
        (validation_trainer_args) caps it at trainer.val_batches global batches."""
        sampler = ShardSampler(len(self.val_ds), self.dp_rank, self.dp_size)
        return DataLoader(self.val_ds, batch_size=self.micro_batch, sampler=sampler, drop_last=False,
                          num_workers=self.num_workers, collate_fn=_collate, pin_memory=self.pin_memory,
                          worker_init_fn=_worker_init if self.num_workers else None,
                          persistent_workers=self.num_workers > 0)       # as _loader's


def align_epoch_progress(batch_progress: Any, batches_done: int, total_done: int) -> None:
    """Make Lightning's restored batch counts the sampler's: `batches_done` in this epoch (the
    optimizer steps the sampler skips in its epoch x batches per step) and `total_done` in all
    (global_step x batches per step).

    Lightning resumes mid-epoch by counting the restored in-epoch batches as fetched and ends the
    epoch once the count reaches len(loader); it fast-forwards no data itself (the sampler does).
    Its restored counts are wrong for the sampler in two cases: a checkpoint written after a run
    stopped at an epoch's last step (last.ckpt: the finished epoch's full count, so the next epoch
    ended after one batch, stepping on a partial accumulation), and a resume with a different
    accumulation count (a different world size at the same micro-batch: k x A_old batches, so
    every later step straddled two global batches). The total count schedules validation
    (val_check_interval counts all batches). Within `current` and within `total` every counter
    moves by the same amount, so Lightning's restart bookkeeping (which compares them) reads the
    same. Called before the fit loop's reset, which reads them."""
    for tracker, done in ((batch_progress.current, batches_done), (batch_progress.total, total_done)):
        shift = done - tracker.ready
        for field in ("ready", "started", "processed", "completed"):
            setattr(tracker, field, getattr(tracker, field) + shift)


class BlockDataset(Dataset):
    """One split of a prepared corpus: the Arrow files `datasets.Dataset.save_to_disk` wrote
    (prepare.py), memory-mapped and read with pyarrow directly. Why not datasets.load_from_disk:
    importing `datasets` cost each rank ~0.6 s of start-up for a read this simple."""

    def __init__(self, folder: Path):
        self.folder = Path(folder)
        files = [f["filename"] for f in json.loads((folder / "state.json").read_text())["_data_files"]]
        self._maps = [pa.memory_map(str(folder / name)) for name in files]  # kept open: the blocks live there
        col = pa.concat_tables([pa.ipc.open_stream(m).read_all() for m in self._maps]).column("input_ids")
        # One zero-copy view of the map per Arrow chunk (save_to_disk writes 1000-row batches):
        # combine_chunks() copied the whole split into each rank's memory (a 100 GB corpus: 100 GB
        # per rank, 800 GB per 8-GPU node; found by review). The page cache holds it once per node.
        size = col.type.list_size
        self._parts = [c.flatten().to_numpy(zero_copy_only=True).reshape(-1, size) for c in col.chunks if len(c)]
        self._starts = np.cumsum([0, *(len(p) for p in self._parts)])

    # A DataLoader worker that is not forked gets the dataset pickled: launcher=local's ranks are
    # forkserver children, and so are their workers; the open memory maps cannot be pickled (every
    # run with data.num_workers >= 1 failed, its error Lightning's teardown RuntimeError). A worker
    # maps the folder again: the same pages, shared through the page cache.
    def __getstate__(self) -> dict:
        return {"folder": str(self.folder)}

    def __setstate__(self, state: dict) -> None:
        self.__init__(Path(state["folder"]))

    def __len__(self) -> int:
        return int(self._starts[-1])

    def __getitem__(self, i: int) -> torch.Tensor:
        if not 0 <= i < len(self):
            raise IndexError(i)
        k = int(np.searchsorted(self._starts, i, side="right")) - 1
        return torch.from_numpy(np.array(self._parts[k][i - self._starts[k]]))  # a copy: the map is read-only


class ShardSampler(Sampler[int]):
    """Indices rank, rank + size, ... of the first floor(n / size) x size samples."""

    def __init__(self, num_samples: int, rank: int, size: int):
        self.indices = list(range(rank, num_samples // size * size, size))

    def __len__(self) -> int:
        return len(self.indices)

    def __iter__(self) -> Iterator[int]:
        return iter(self.indices)


def validation_trainer_args(trainer_cfg: Any, accumulate: int) -> dict:
    """Trainer arguments for trainer.val_every_n_steps (None: no validation). Lightning counts its
    val_check_interval in training batches, so N optimizer steps are N x accumulate batches;
    limit_val_batches counts this rank's micro-batches: val_batches global batches are
    val_batches x accumulate of them on every rank."""
    every = trainer_cfg.get("val_every_n_steps")
    if not every:
        return {"limit_val_batches": 0}
    return {"val_check_interval": int(every) * accumulate, "check_val_every_n_epoch": None,
            "limit_val_batches": int(trainer_cfg.get("val_batches") or 8) * accumulate}


class ValidationCurve(L.Callback):
    """The val loss after each validation during fit: Lightning's epoch mean of `val/loss`
    (LitModule.validation_step logs it with sync_dist: the mean over ranks, every rank holds it)."""

    def __init__(self, every_n_steps: int, batches: int):
        self.every_n_steps, self.batches = every_n_steps, batches
        self.curve: list[list] = []
        self.micro_batches = 0   # this rank's micro-batches in the last validation (a small val split has fewer)
        self._counting = 0

    def on_validation_start(self, trainer, pl_module) -> None:
        self._counting = 0

    def on_validation_batch_end(self, trainer, pl_module, outputs, batch, batch_idx, dataloader_idx=0) -> None:
        self._counting += 1

    @classmethod
    def for_config(cls, trainer_cfg: Any) -> ValidationCurve | None:
        every = trainer_cfg.get("val_every_n_steps")
        return cls(int(every), int(trainer_cfg.get("val_batches") or 8)) if every else None

    def on_validation_end(self, trainer, pl_module) -> None:
        if trainer.sanity_checking:
            return
        loss = trainer.callback_metrics.get("val/loss")
        if loss is not None:
            self.curve.append([int(trainer.global_step), float(loss)])
            self.micro_batches = self._counting

    def record(self) -> dict:
        """run.json's `val`."""
        return {"every_n_steps": self.every_n_steps, "batches": self.batches,   # the cap: trainer.val_batches
                "micro_batches_per_rank": self.micro_batches, "curve": self.curve,
                "final": self.curve[-1][1] if self.curve else None,
                "final_step": self.curve[-1][0] if self.curve else None}


def _worker_init(worker_id: int) -> None:
    """A DataLoader worker ignores SIGTERM: torchrun (and a pod's stop) SIGTERMs each rank's whole
    process group, and a worker that died of it made the rank's next batch raise ("DataLoader
    worker exited unexpectedly") before the rank could agree on a step and save
    (scalelab.requeue). The workers end with their rank (torch's parent watchdog) or are killed
    after the grace. Lightning's per-worker seeding, which it adds only to a loader without a
    worker_init_fn, is kept (seed_everything(workers=True) sets PL_SEED_WORKERS)."""
    import os
    import signal

    signal.signal(signal.SIGTERM, signal.SIG_IGN)
    if int(os.environ.get("PL_SEED_WORKERS", 0)):
        from lightning.fabric.utilities.seed import pl_worker_init_function

        pl_worker_init_function(worker_id)


def _collate(rows: list[torch.Tensor]) -> torch.Tensor:
    return torch.stack(rows).long()

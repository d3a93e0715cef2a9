"""LightningDataModule over a prepared byte corpus (see prepare.py)."""
from __future__ import annotations

from pathlib import Path

import datasets
import lightning as L
from torch.utils.data import DataLoader

from scalelab.data.sampler import GlobalBatchSampler


class ByteCorpusDataModule(L.LightningDataModule):
    """Serves (seq_len+1)-token blocks. The data-parallel rank and size come from the strategy
    plan (tensor-parallel peers must see the same samples), not from the global rank."""

    def __init__(self, prepared: str | Path, global_batch: int, micro_batch: int, dp_rank: int,
                 dp_size: int, seed: int, num_workers: int = 0):
        super().__init__()
        self.prepared = Path(prepared)
        self.global_batch, self.micro_batch = global_batch, micro_batch
        self.dp_rank, self.dp_size, self.seed, self.num_workers = dp_rank, dp_size, seed, num_workers

    def setup(self, stage: str | None = None) -> None:
        self.train_ds = datasets.load_from_disk(str(self.prepared / "train")).with_format("torch")
        self.val_ds = datasets.load_from_disk(str(self.prepared / "val")).with_format("torch")

    def _loader(self, ds, shuffle: bool, start_step: int = 0, lightning_epoch: int | None = None) -> DataLoader:
        sampler = GlobalBatchSampler(len(ds), self.global_batch, self.micro_batch, self.dp_rank,
                                     self.dp_size, self.seed, shuffle=shuffle, start_step=start_step,
                                     lightning_epoch=lightning_epoch)
        return DataLoader(ds, batch_size=self.micro_batch, sampler=sampler, drop_last=True,
                          num_workers=self.num_workers, collate_fn=_collate)

    def train_dataloader(self) -> DataLoader:
        # After a resume, continue with the global batch the interrupted run would have used next
        # (Lightning restores global_step before it asks for the dataloader).
        step = self.trainer.global_step if self.trainer is not None else 0
        epoch = self.trainer.current_epoch if self.trainer is not None else None
        return self._loader(self.train_ds, shuffle=True, start_step=step, lightning_epoch=epoch)

    def val_dataloader(self) -> DataLoader:
        return self._loader(self.val_ds, shuffle=False)


def _collate(rows: list[dict]):
    import torch

    return torch.stack([r["input_ids"] for r in rows]).long()

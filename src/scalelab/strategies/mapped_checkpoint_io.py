"""How single and the ddp family write and read their checkpoint file (one torch.save of the
whole state, rank 0 writing, every rank reading). Lightning's TorchCheckpointIO read it with
torch.load into each rank's own memory: on resume a node of 8 ranks held 8 copies of the model
and its optimizer state (16 bytes per parameter under Adam: a 3B model, 48 GB per rank, 384 GB
per node), and saved it through an in-memory buffer first (_atomic_save: two full copies on rank
0). Found by review. Here a checkpoint is loaded memory-mapped (torch.load(mmap=True)): the
ranks of a node share the file's pages, and load_state_dict copies each tensor to its device;
and saved straight to the file, under a temporary name renamed when complete (atomic, as before).
"""
from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import torch
from lightning.fabric.plugins.io.torch_io import TorchCheckpointIO


class MappedCheckpointIO(TorchCheckpointIO):
    def save_checkpoint(self, checkpoint: dict[str, Any], path, storage_options: Any = None) -> None:
        if storage_options is not None:
            raise TypeError(f"{type(self).__name__} takes no storage_options")
        path = Path(path)
        path.parent.mkdir(parents=True, exist_ok=True)
        part = path.with_name(path.name + ".part")
        torch.save(checkpoint, part)
        os.replace(part, path)

    def load_checkpoint(self, path, map_location: Any = None, weights_only: bool | None = None) -> dict[str, Any]:
        if not Path(path).exists():
            raise FileNotFoundError(f"Checkpoint file not found: {path}")
        return torch.load(str(path), map_location="cpu", mmap=True, weights_only=weights_only)

"""Prepare a corpus once, before any rank starts, into an Arrow dataset on disk.

Called by the Hydra job (one process) so ranks only memory-map the result. A lock-free
write-then-rename keeps concurrent jobs from reading a half-written cache.
"""
from __future__ import annotations

import os
import shutil
import tempfile
from pathlib import Path

import datasets
import pyarrow as pa
from tqdm.auto import tqdm

from scalelab.data import corpus
from scalelab.errors import ConfigError


def prepared_dir(cfg: dict, seq_len: int, cache_root: Path) -> Path:
    return cache_root / "data" / f"{cfg['source']}-{corpus.source_key(cfg)}-T{seq_len}"


def prepare(cfg: dict, seq_len: int, cache_root: Path, progress: bool = True) -> Path:
    """Return the folder holding `train/` and `val/` Arrow datasets of (seq_len+1)-byte blocks."""
    out = prepared_dir(cfg, seq_len, cache_root)
    if (out / "train" / "dataset_info.json").exists():
        return out
    out.parent.mkdir(parents=True, exist_ok=True)
    docs = corpus.load_documents(cfg)
    val_fraction = float(cfg.get("val_fraction", 0.02))
    splits: dict[str, list] = {"train": [], "val": []}
    for name, data in tqdm(docs, desc=f"prepare {cfg['source']} corpus", unit="doc",
                           disable=not progress, mininterval=0.5):
        splits["val" if corpus._is_val(name, val_fraction) else "train"].append((name, data))
    tmp = Path(tempfile.mkdtemp(dir=out.parent, prefix=".tmp-"))
    try:
        for split, split_docs in splits.items():
            blocks = corpus._blocks(split_docs, seq_len + 1)
            if split == "train" and len(blocks) == 0:
                raise ConfigError(f"data: the corpus yields no block of {seq_len + 1} bytes; "
                                  "give more text or a smaller model.seq_len")
            # Straight to Arrow: Dataset.from_dict on a 2-D array goes through Python lists (~50x slower).
            column = pa.FixedSizeListArray.from_arrays(pa.array(blocks.reshape(-1)), seq_len + 1)
            ds = datasets.Dataset(pa.table({"input_ids": column}))
            ds.save_to_disk(str(tmp / split))
        try:
            os.rename(tmp, out)
        except OSError:  # another job finished first: keep theirs
            pass
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return out

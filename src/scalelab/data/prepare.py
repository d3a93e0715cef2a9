"""Prepare a corpus once, before any rank starts, into an Arrow dataset on disk.

Called by the command's preflight (so a corpus too small for the run fails with one line before
Hydra starts a job) and by the Hydra job (a cache hit by then), so ranks only memory-map the
result. A lock-free write-then-rename keeps concurrent jobs from reading a half-written cache.

The folder holds `train/` and `val/` (absent when data.val_fraction is 0) and `meta.json`: the
block and document counts and how the split was made (corpus.py).
"""
from __future__ import annotations

import json
import os
import shutil
import tempfile
from pathlib import Path
from typing import Any

import numpy as np

from scalelab.data import corpus, tables
from scalelab.errors import ConfigError

META_FILE = "meta.json"
TMP_PREFIX = ".tmp-"


def prepared_dir(cfg: dict, seq_len: int, cache_root: Path) -> Path:
    return cache_root / "data" / f"{cfg['source']}-{corpus.source_key(cfg)}-v{corpus.PREP_VERSION}-T{seq_len}"


def _save(blocks: np.ndarray, block: int, path: Path) -> None:
    import hashlib

    import datasets
    import pyarrow as pa

    # Straight to Arrow: Dataset.from_dict on a 2-D array goes through Python lists (~50x slower).
    # pa.array of a contiguous uint8 array wraps its memory (no copy).
    flat = np.ascontiguousarray(blocks).reshape(-1)
    column = pa.FixedSizeListArray.from_arrays(pa.array(flat), block)
    # A fingerprint of the blocks' bytes: without one, Dataset() makes its own by pickling the whole
    # table into memory to hash it (~4 copies of the corpus at once: the peak of preparing)
    fingerprint = hashlib.blake2b(flat.data, digest_size=8, person=b"scalelab%d" % block).hexdigest()
    was_off = datasets.is_progress_bar_enabled() is False
    datasets.disable_progress_bars()  # its "Saving the dataset" bars: prepare prints one line instead
    try:
        datasets.Dataset(pa.table({"input_ids": column}), fingerprint=fingerprint).save_to_disk(str(path))
    finally:
        if not was_off:
            datasets.enable_progress_bars()


def prepare(cfg: dict, seq_len: int, cache_root: Path, progress: bool = True) -> Path:
    """Return the folder holding `train/` and `val/` Arrow datasets of (seq_len+1)-byte blocks."""
    out = prepared_dir(cfg, seq_len, cache_root)
    if (out / META_FILE).exists():
        if progress and out not in _announced:   # what the cache holds, once a command (a hit was silent)
            _announce(read_meta(out), out, cached=True)
        return out
    out.parent.mkdir(parents=True, exist_ok=True)
    block = seq_len + 1
    val_fraction = float(cfg.get("val_fraction", 0.02))
    info: dict[str, Any] = {}
    # the corpus is held once: documents go into one buffer as they are read, the train blocks are
    # moved together inside it (only the val blocks are copied), and Arrow wraps it
    flat, n_docs, n_bytes = corpus.stream(corpus.iter_documents(cfg, info, Path(cache_root) / "tmp"))
    n_blocks = len(flat) // block
    blocks = flat[: n_blocks * block].reshape(n_blocks, block)
    seed = corpus.split_seed(cfg)
    val_idx = corpus.split_blocks(n_blocks, val_fraction, seed, block)
    train, val = take_val(blocks, val_idx)
    meta = {"version": corpus.PREP_VERSION, "source": cfg["source"], "documents": n_docs,
            "bytes": n_bytes, "block_bytes": block, "blocks": n_blocks,
            "train_blocks": len(train), "val_blocks": len(val), "val_fraction": val_fraction,
            "split": "by token block: the round(blocks x val_fraction) (>= 1 if > 0) blocks of smallest "
                     "splitmix64(index ^ split_seed); split_seed from the data config", "split_seed": seed, **info}
    # named HOST+PID+: a prepare killed (SIGKILL, the OOM killer) left its .tmp- folder, up to the
    # corpus's size, for good; a later prepare on this host removes those whose process is gone
    tmp = Path(tempfile.mkdtemp(dir=tables.clear_stale(out.parent, TMP_PREFIX),
                                prefix=tables.tmp_prefix(TMP_PREFIX)))
    # mkdtemp makes it 0700, which the rename keeps: a cache shared by a team (data.cache_dir on a
    # group-writable file system) would be unreadable to everyone but its first user
    umask = os.umask(0)
    os.umask(umask)
    os.chmod(tmp, 0o777 & ~umask)
    try:
        _save(train, block, tmp / "train")
        if meta["val_blocks"]:  # an empty Arrow dataset does not load back (IndexError): none is written
            _save(val, block, tmp / "val")
        (tmp / META_FILE).write_text(json.dumps(meta, indent=2))
        try:
            os.rename(tmp, out)
        except OSError:  # another job finished first: keep theirs
            pass
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    if progress:
        _announce(meta, out, cached=False)
    return out


_announced: set[Path] = set()


def _announce(meta: dict, out: Path, cached: bool) -> None:
    """The data line: what the corpus gave, the files not read and why, where it is cached."""
    _announced.add(out)
    skipped = meta.get("skipped_files") or {}
    notes = [f"{v} {k} files skipped" for k, v in skipped.items() if v]
    notes += [f"{v} file(s) {k} not read" for k, v in (meta.get("left_out") or {}).items() if v]
    print(f"[scalelab] data: {meta['documents']} documents, {meta['bytes']:,} bytes -> {meta['train_blocks']} "
          f"train + {meta['val_blocks']} val blocks of {meta['block_bytes']} bytes"
          f"{' (' + '; '.join(notes) + ')' if notes else ''} -> {out}{' (cached)' if cached else ''}", flush=True)


def data_identity(prepared: str | Path) -> str | None:
    """What a prepared folder holds, as nodes compare it (same_job.check): its documents and bytes
    and its train and val blocks' fingerprints (a hash of their bytes, _save); None where unreadable."""
    prepared = Path(prepared)
    try:
        meta = json.loads((prepared / META_FILE).read_text())
        prints = [json.loads((prepared / split / "state.json").read_text())["_fingerprint"]
                  for split in ("train", "val") if (prepared / split).is_dir()]
    except (OSError, ValueError, KeyError, TypeError):
        return None
    return f"{meta.get('documents')} documents, {meta.get('bytes')} bytes (blocks {'/'.join(prints)})"


def take_val(blocks: np.ndarray, val_idx: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(train, val) rows of blocks: val a copy of the rows val_idx (sorted, unique), train every
    other row in order, moved forward inside `blocks` itself (writable; its content is overwritten):
    what blocks[~is_val] gives, without a second copy of the corpus. Each move is of at most
    max(distance moved, 64 Ki rows): where it overlaps its destination, numpy's temporary copy
    of it is that small."""
    val = blocks[val_idx].copy()
    write = 0
    start = 0
    for end in [*val_idx.tolist(), len(blocks)]:   # the train rows [start, end), then val row `end`
        src = start
        while src < end:
            shift = src - write
            step = end - src if shift == 0 else min(end - src, max(shift, 1 << 16))
            if shift:
                blocks[write:write + step] = blocks[src:src + step]
            write += step
            src += step
        start = end + 1
    return blocks[:write], val


def read_meta(prepared: Path) -> dict:
    return json.loads((Path(prepared) / META_FILE).read_text())


def check_size(meta: dict, global_batch: int, dp_size: int, validation: bool,
               length_key: str = "model.arch.seq_len") -> None:
    """The run needs one global batch of training blocks and, with validation on, one val block
    per data-parallel rank."""
    b = meta["block_bytes"]
    if meta["train_blocks"] < global_batch:
        raise ConfigError(f"data: the corpus yields {meta['train_blocks']} training blocks of {b} bytes, fewer than "
                          f"one global batch of {global_batch} (data.global_batch_size); give more text, or lower "
                          f"data.global_batch_size or {length_key}")
    if validation and meta["val_blocks"] < dp_size:
        raise ConfigError(f"data: the val split has {meta['val_blocks']} block(s) of {b} bytes, fewer than one per "
                          f"data-parallel rank ({dp_size}) for trainer.val_every_n_steps; raise data.val_fraction "
                          "or give more text")


def prepare_for_run(cfg: Any, spec: Any, progress: bool = True) -> Path:
    """Prepare (or find cached) the job's data and check it is enough for the run: a ConfigError
    otherwise. cfg: the job's config (DictConfig or resolved dict); spec: config.validate's JobSpec."""
    if not isinstance(cfg, dict):
        from omegaconf import OmegaConf

        cfg = OmegaConf.to_container(cfg, resolve=True)
    out = prepare(cfg["data"], spec.seq_len, Path(cfg["cache_dir"]), progress)
    length_key = "model.arch.seq_len" if cfg["model"].get("task") == "lm" else "model.arch.in_features"
    check_size(read_meta(out), spec.batch.global_batch_size, spec.batch.dp_size,
               bool(cfg["trainer"].get("val_every_n_steps")), length_key)
    return out


def run_data(prepared: str | Path, data_cfg: dict) -> dict:
    """run.json `data`: what the run trained on. The record had only the config as typed (relative
    paths, no working folder) and the prepared folder's name: two runs on two notes.txt of two
    folders read alike (found by review). Here: the source's paths resolved, the prepared folder
    and its fingerprint (data_identity), and its documents, bytes, blocks, split seed and the files
    read and skipped (meta.json)."""
    out: dict[str, Any] = {"source": data_cfg.get("source"), "prepared": str(Path(prepared).resolve())}
    if data_cfg.get("source") == "files":
        out["paths"] = [str(Path(str(f)).expanduser().resolve()) for f in data_cfg.get("files") or []]
    elif data_cfg.get("source") == "hub" and data_cfg.get("hub_name"):
        local = tables.local_paths(str(data_cfg["hub_name"]))
        out["paths"] = [str(p.resolve()) for p in local] if local else None   # none: a hub dataset id
    out["fingerprint"] = data_identity(prepared)
    try:
        meta = read_meta(prepared)
    except (OSError, ValueError):
        return out
    keys = ("documents", "bytes", "blocks", "train_blocks", "val_blocks", "block_bytes", "split_seed", "files",
            "skipped_files", "left_out")
    return {**out, **{k: meta[k] for k in keys if k in meta}}

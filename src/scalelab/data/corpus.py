"""Byte-level corpora prepared once into Arrow (HF `datasets`) and cached.

Sources:
- "stdlib": the running interpreter's own standard-library .py files (the embedded default:
  present on every machine, no download).
- "files": local text files or folders given by the user.
- "hub": a Hugging Face hub dataset name (needs network), its `text_column`.

Each source becomes fixed-length blocks of seq_len + 1 byte tokens (inputs and shifted
targets). Train/val split is per document, by a hash of its name, so it is deterministic and
never cuts a file across the split.
"""
from __future__ import annotations

import hashlib
import json
import sysconfig
from pathlib import Path

import numpy as np

from scalelab.errors import ConfigError

PREP_VERSION = 1  # bump when the block layout changes, to invalidate caches


def stdlib_documents() -> list[tuple[str, bytes]]:
    root = Path(sysconfig.get_paths()["stdlib"])
    files = sorted(p for p in root.rglob("*.py") if "site-packages" not in p.parts)
    return [(str(p.relative_to(root)), p.read_bytes()) for p in files]


def file_documents(paths: list[str]) -> list[tuple[str, bytes]]:
    docs = []
    for raw in paths:
        p = Path(raw).expanduser()
        if not p.exists():
            raise ConfigError(f"data.files: {raw!r} does not exist (give existing text files or folders)")
        files = sorted(f for f in p.rglob("*") if f.is_file()) if p.is_dir() else [p]
        docs += [(str(f), f.read_bytes()) for f in files]
    if not docs:
        raise ConfigError(f"data.files: no files found under {paths!r}")
    return docs


def hub_documents(name: str, split: str, text_column: str) -> list[tuple[str, bytes]]:
    import datasets

    ds = datasets.load_dataset(name, split=split)
    if text_column not in ds.column_names:
        raise ConfigError(f"data.text_column={text_column!r} not in {name}: choose one of {ds.column_names}")
    return [(f"{name}/{i}", t.encode("utf-8")) for i, t in enumerate(ds[text_column])]


def _is_val(doc_name: str, val_fraction: float) -> bool:
    h = int.from_bytes(hashlib.sha1(doc_name.encode()).digest()[:4], "little")
    return h / 2**32 < val_fraction


def _blocks(docs: list[tuple[str, bytes]], block: int) -> np.ndarray:
    """Concatenate documents (separated by a 0 byte) and cut into non-overlapping blocks."""
    if not docs:
        return np.zeros((0, block), dtype=np.uint8)
    flat = np.frombuffer(b"\x00".join(d for _, d in docs), dtype=np.uint8)
    n = len(flat) // block
    return flat[: n * block].reshape(n, block)


def source_key(cfg: dict) -> str:
    """A short, stable id of what the prepared data depends on (its cache folder name)."""
    src = {k: cfg.get(k) for k in ("source", "files", "hub_name", "hub_split", "text_column",
                                   "val_fraction", "max_documents")}
    if cfg.get("source") == "files":  # content changes must invalidate the cache
        src["mtimes"] = [Path(f).stat().st_mtime_ns for f in cfg.get("files") or [] if Path(f).exists()]
    src["version"] = PREP_VERSION
    return hashlib.sha1(json.dumps(src, sort_keys=True, default=str).encode()).hexdigest()[:12]


def load_documents(cfg: dict) -> list[tuple[str, bytes]]:
    source = cfg["source"]
    if source == "stdlib":
        docs = stdlib_documents()
    elif source == "files":
        docs = file_documents(list(cfg.get("files") or []))
    elif source == "hub":
        docs = hub_documents(cfg["hub_name"], cfg.get("hub_split", "train"), cfg.get("text_column", "text"))
    else:
        raise ConfigError(f"data.source={source!r} is not known: choose one of stdlib, files, hub")
    if cfg.get("max_documents"):
        docs = docs[: int(cfg["max_documents"])]
    return docs

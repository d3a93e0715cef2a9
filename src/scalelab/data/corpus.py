"""Byte-level corpora prepared once into Arrow (HF `datasets`) and cached.

Sources:
- "stdlib": the running interpreter's own standard-library .py files (the embedded default:
  present on every machine, no download).
- "files": local text files (plain, or .gz/.bz2/.xz: read decompressed) or folders given by the
  user. A file named on the command line is
  always read; inside a folder (recursively, following symlinked folders, each real folder once),
  hidden entries (names starting with "."), empty files and binary files (a NUL byte in the first
  8 KiB) are skipped, and counted. A file reached twice (named twice, or through two links) is read
  once, where it is first reached.
- "hub": a Hugging Face dataset, its `text_column`: a hub name (owner/name; needs network; its
  configuration, e.g. wikitext's wikitext-2-raw-v1, in `hub_config`), a local folder written by
  `datasets.Dataset.save_to_disk` / `DatasetDict.save_to_disk`, or local data files: a .jsonl,
  .json, .csv or .parquet file (the first three also .gz/.bz2/.xz), or a folder of them (tables.py;
  load_dataset("json", data_files=...)).

Each source becomes one stream (documents joined by a 0 byte) cut into fixed-length blocks of
seq_len + 1 byte tokens (inputs and shifted targets). The train/val split is by block: a fixed
share of the blocks (val_fraction, rounded, at least 1 when > 0) is held out, chosen by a hash of
the block index seeded by the data config (split_seed: not the run seed, so every strategy, world
size and seed sees the same split; local paths count by where they lead, not how they are
spelled). One file, a handful of files or a hub dataset all get both splits; no block is in both.
"""
from __future__ import annotations

import contextlib
import hashlib
import itertools
import json
import os
import platform
import re
import sysconfig
from collections.abc import Iterable, Iterator
from pathlib import Path

import numpy as np

from scalelab.data import tables
from scalelab.data.text_files import _folder_files, iter_file_documents   # the "files" source
from scalelab.errors import ConfigError

PREP_VERSION = 5  # bump when the block layout or split changes, to invalidate caches (2: split by block;
#                  3: split seed from resolved paths, symlinked folders followed, a file reached twice read once;
#                  4: those paths relative to the working directory where inside it;
#                  5: .gz/.bz2/.xz files read: a folder's compressed files, passed over before)
# owner/name or name, as the hub spells dataset ids (no leading ".", "/" or "~", at most one "/")
_HUB_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.-]*(/[A-Za-z0-9][A-Za-z0-9_.-]*)?$")


def stdlib_documents() -> list[tuple[str, bytes]]:
    return list(iter_stdlib_documents())


def iter_stdlib_documents() -> Iterator[tuple[str, bytes]]:
    root = Path(sysconfig.get_paths()["stdlib"])
    files = sorted(p for p in root.rglob("*.py") if "site-packages" not in p.parts)
    return ((str(p.relative_to(root)), p.read_bytes()) for p in files)


def hub_kind(name: str) -> str:
    """'local' (an existing folder or file: save_to_disk's or data files) or 'hub' (a plausible hub
    id: load_dataset).
    Anything else is a ConfigError naming both readings."""
    name = str(name)
    if tables.local_paths(name):
        return "local"
    if tables.is_pattern(name):
        raise ConfigError(f"data.hub_name={name!r} matches no file")
    # a data file by its name (notes.jsonl, data/x.csv with data/ here): not a hub id to retry for
    # ~25 s offline; owner/name.csv is one (hub names may end so)
    local_file = tables.data_ext(Path(name)) in tables.FORMATS and ("/" not in name or Path(name).parent.exists())
    if _HUB_NAME.match(name) and not local_file:
        return "hub"
    raise ConfigError(f"data.hub_name={name!r} is neither an existing folder or file (written by datasets' "
                      "save_to_disk, or .jsonl/.json/.csv/.parquet data, the first three also .gz/.bz2/.xz; "
                      f"relative paths from {Path.cwd()}) nor a hub dataset name (owner/name)")


PROXY_VARS = ("HTTPS_PROXY", "https_proxy", "HTTP_PROXY", "http_proxy", "ALL_PROXY")


def _hub_reachable(timeout_s: float = 3.0) -> bool:
    """A TCP connection to the Hub's endpoint (HF_ENDPOINT, a mirror, when set) opens. True where
    this cannot tell: behind a proxy (the probe would go around it), an endpoint it cannot parse."""
    import socket
    from urllib.parse import urlparse

    if any(os.environ.get(k) for k in PROXY_VARS):
        return True
    try:
        url = urlparse(os.environ.get("HF_ENDPOINT") or "https://huggingface.co")
        host, port = url.hostname, url.port or (443 if url.scheme == "https" else 80)
    except ValueError:
        return True
    if not host or url.scheme not in ("http", "https"):
        return True
    try:
        socket.create_connection((host, port), timeout=timeout_s).close()
        return True
    except OSError:
        return False


@contextlib.contextmanager
def _hub_offline(offline: bool):
    """Hugging Face's offline mode (HF_HUB_OFFLINE) while in the block: datasets and huggingface_hub
    read it from their modules' constants at each call (the environment only at import)."""
    if not offline:
        yield
        return
    import datasets
    from huggingface_hub import constants

    before = (datasets.config.HF_HUB_OFFLINE, constants.HF_HUB_OFFLINE)
    datasets.config.HF_HUB_OFFLINE = constants.HF_HUB_OFFLINE = True
    try:
        yield
    finally:
        datasets.config.HF_HUB_OFFLINE, constants.HF_HUB_OFFLINE = before


def hub_documents(name: str, split: str, text_column: str, config: str | None = None) -> list[tuple[str, bytes]]:
    return list(iter_hub_documents(name, split, text_column, config))


def iter_hub_documents(name: str, split: str, text_column: str, config: str | None = None,
                       info: dict | None = None, tmp_root: Path | None = None) -> Iterator[tuple[str, bytes]]:
    """The non-empty `text_column` values of a hub dataset (`config`: its configuration name, as
    load_dataset's second argument, e.g. wikitext's wikitext-2-raw-v1), of a folder written by
    save_to_disk, or of local data files (tables.py: a .jsonl/.json/.csv/.parquet file, a folder of
    them), as (name/row, UTF-8 bytes). `info` (optional) receives a folder's files left out
    (tables.data_files)."""
    import datasets

    if hub_kind(name) == "local":
        path = Path(str(name)).expanduser()
        if config is not None:
            raise ConfigError(f"data.hub_config={config!r} names a configuration of a hub dataset; {name} is a local "
                              "path (set data.hub_config=null)")
        fmt, files = ("", []) if tables.is_saved_dataset(path) else tables.data_files(str(name), split, info)
        if files:
            ds = tables.load_files(str(name), fmt, files, tmp_root)
        else:
            try:
                ds = datasets.load_from_disk(str(path))
            except (FileNotFoundError, ValueError) as e:
                raise ConfigError(f"data.hub_name={name!r} is a folder but not a dataset written by save_to_disk "
                                  f"({str(e).splitlines()[0][:200]}) nor holds {', '.join(tables.FOLDER_EXTS)} "
                                  "files; for plain text files use data=text_files") from e
            except Exception as e:  # noqa: BLE001 - a cut or unreadable Arrow file (OSError, ArrowInvalid): one line
                why = (str(e).strip().splitlines() or [""])[0][:200]
                raise ConfigError(f"data.hub_name={name!r}: its dataset written by save_to_disk could not be read "
                                  f"({type(e).__name__}: {why}): is a file of it cut short or unreadable?") from e
            if isinstance(ds, datasets.DatasetDict):
                if split not in ds:
                    raise ConfigError(f"data.hub_split={split!r} is not in {name}: choose one of {', '.join(ds)}")
                ds = ds[split]
            elif split != "train" and str(ds.split) != split:   # it was read whole, whatever the split said
                raise ConfigError(f"data.hub_split={split!r}: {name} is one dataset written by Dataset.save_to_disk "
                                  f"(split {ds.split or 'not named'}), not a DatasetDict of splits: leave "
                                  "data.hub_split=train")
    else:
        import logging
        import sys

        # huggingface_hub logs each of its retries (11 lines over ~23 s offline): one line instead
        label = f"{name} ({config})" if config is not None else name
        print(f"[scalelab] data: {label} from the Hugging Face Hub (cached after the first time)", file=sys.stderr,
              flush=True)
        hub_log = logging.getLogger("huggingface_hub")
        level = hub_log.level
        hub_log.setLevel(logging.ERROR)
        # the probe first: offline, load_dataset retried for ~25 s before its error (a wrong folder
        # name without a slash too); in offline mode it reads the Hugging Face cache or fails at once
        reachable = _hub_reachable()
        try:
            with _hub_offline(not reachable):
                named = {} if config is None else {"name": config}   # load_dataset's config name
                ds = datasets.load_dataset(name, split=split, **named)
        except Exception as e:  # noqa: BLE001 - offline, unknown name, config or split: one line
            key = "data.hub_config" if config is not None and "config" in str(e).lower() else "data.hub_name"
            value = config if key == "data.hub_config" else name
            hint = " (set data.hub_config=NAME)" if config is None and "config" in str(e).lower() else ""
            raise ConfigError(f"{key}={value!r}: {type(e).__name__}: {str(e).splitlines()[0][:300]}{hint}"
                              + ("" if reachable else " (the Hub is not reachable from here and the dataset is "
                                 "not in the Hugging Face cache: a dataset written by save_to_disk loads "
                                 "offline, data.hub_name=/path/to/it; there is no file or folder "
                                 f"{name!r} in {Path.cwd()})")) from e
        finally:
            hub_log.setLevel(level)
    if text_column not in ds.column_names:
        raise ConfigError(f"data.text_column={text_column!r} not in {name}: choose one of {ds.column_names}")
    feature = ds.features[text_column]
    if not _is_text(feature):  # str() of ints or lists would train on their Python repr
        text = [c for c in ds.column_names if _is_text(ds.features[c])]
        valid = f"choose a string column: {', '.join(text)}" if text else "it has no string column"
        raise ConfigError(f"data.text_column={text_column!r} in {name} holds {_feature_name(feature)} values, "
                          f"not text; {valid}")
    return tables.text_rows(ds, name, text_column)


def _is_text(feature) -> bool:
    """A column of strings (Arrow string or large_string)."""
    return getattr(feature, "dtype", None) in ("string", "large_string")


def _feature_name(feature) -> str:
    """int64 for Value('int64'); the feature's repr otherwise (List(Value('int64')), a dict of them)."""
    if type(feature).__name__ == "Value":
        return str(feature.dtype)
    return " ".join(repr(feature).split())[:80]


def stream(docs: Iterable[tuple[str, bytes]]) -> tuple[np.ndarray, int, int]:
    """(the documents joined by a 0 byte, as a writable uint8 array; documents; their bytes), each
    document appended as it is read and then dropped: the corpus is held once (a bytearray grows in
    place: a large one is remapped, not copied), not as a list of documents and their join."""
    buf = bytearray()
    n_docs = n_bytes = 0
    for _, data in docs:
        if n_docs:
            buf.append(0)
        buf += data
        n_docs += 1
        n_bytes += len(data)
    return np.frombuffer(buf, dtype=np.uint8), n_docs, n_bytes


def _blocks(docs: Iterable[tuple[str, bytes]], block: int) -> np.ndarray:
    """Concatenate documents (separated by a 0 byte) and cut into non-overlapping blocks."""
    flat = stream(docs)[0]
    n = len(flat) // block
    return flat[: n * block].reshape(n, block)


def split_seed(cfg: dict) -> int:
    """The split's seed: what the data is (source, files, hub dataset and config, column,
    max_documents), not the run seed nor val_fraction (a larger fraction holds out a superset of the
    blocks). Local paths count by _where ('data', './data' and /abs/data: one split; the same
    relative files in another checkout or on another node: the same split); a hub id as given."""
    ident = {k: cfg.get(k) for k in ("source", "files", "hub_name", "hub_split", "text_column", "max_documents")}
    if cfg.get("hub_config") is not None:  # only when set: the splits of configs without it stay as they were
        ident["hub_config"] = cfg["hub_config"]
    if cfg.get("source") == "files" and ident["files"]:
        ident["files"] = [_where(f) for f in ident["files"]]
    elif cfg.get("source") == "hub" and ident["hub_name"] and (Path(str(ident["hub_name"])).expanduser().exists()
                                                               or tables.is_pattern(ident["hub_name"])):
        ident["hub_name"] = _where(ident["hub_name"])
    return int.from_bytes(hashlib.sha1(json.dumps(ident, sort_keys=True, default=str).encode()).digest()[:8],
                          "little")


def _where(path) -> str:
    """A local path as the split seed counts it: resolved (links, '.', '..', a trailing '/'), then
    relative to the working directory where it is inside it. Absolute, the seed followed the
    checkout's place: the same command in /home/a/proj and /scratch/b/proj (or on two nodes of one
    job) split the same files apart."""
    p = Path(str(path)).expanduser()
    full = p.resolve() if not tables.is_pattern(str(path)) else Path(os.path.abspath(p))
    try:
        return full.relative_to(Path.cwd().resolve()).as_posix()
    except ValueError:
        return str(full)


def _mix64(x: np.ndarray) -> np.ndarray:
    """splitmix64's finalizer on uint64 (wrapping arithmetic): the same on every numpy version."""
    with np.errstate(over="ignore"):
        x = x + np.uint64(0x9E3779B97F4A7C15)
        x = (x ^ (x >> np.uint64(30))) * np.uint64(0xBF58476D1CE4E5B9)
        x = (x ^ (x >> np.uint64(27))) * np.uint64(0x94D049BB133111EB)
        return x ^ (x >> np.uint64(31))


def val_block_count(n_blocks: int, val_fraction: float) -> int:
    """round(n_blocks x val_fraction), at least 1 when val_fraction > 0."""
    if val_fraction <= 0:
        return 0
    return max(1, int(np.floor(n_blocks * val_fraction + 0.5)))


def split_blocks(n_blocks: int, val_fraction: float, seed: int, block_bytes: int) -> np.ndarray:
    """Sorted indices of the val blocks: the val_block_count(...) blocks of smallest
    hash(seed, index). Raises ConfigError if either split would be empty."""
    if not 0 <= val_fraction < 1:
        raise ConfigError(f"data.val_fraction={val_fraction!r} must be a number in [0, 1)")
    if n_blocks == 0:
        raise ConfigError(f"data: the corpus yields no block of {block_bytes} bytes; "
                          "give more text or a smaller model.arch.seq_len")
    n_val = val_block_count(n_blocks, val_fraction)
    if n_blocks - n_val < 1:
        raise ConfigError(f"data: the corpus yields {n_blocks} block(s) of {block_bytes} bytes, too few for a "
                          f"train and a val split (data.val_fraction={val_fraction}); give more text or a smaller "
                          "model.arch.seq_len")
    if n_val == 0:
        return np.zeros(0, dtype=np.int64)
    keys = _mix64(np.arange(n_blocks, dtype=np.uint64) ^ np.uint64(seed))
    return np.sort(np.argsort(keys, kind="stable")[:n_val])


def _tree_stamp(p: Path) -> list:
    """What changes when the data under p changes: (name, size, mtime, ctime) of the file or of every
    file under the folder. ctime too: a revised file whose size and mtime were kept (cp -p, rsync -t,
    touch -r, tar x) was served from the cache as it was before (review 2026-12-04); its ctime, which
    no user sets, changed."""
    files = _folder_files(p)[0] if p.is_dir() else [p]
    out = []
    for f in files:
        st = f.stat()
        out.append([str(f), st.st_size, st.st_mtime_ns, st.st_ctime_ns])
    return out


def source_key(cfg: dict) -> str:
    """A short, stable id of what the prepared data depends on (its cache folder name)."""
    src = {k: cfg.get(k) for k in ("source", "files", "hub_name", "hub_split", "text_column",
                                   "val_fraction", "max_documents")}
    if cfg.get("hub_config") is not None:  # only when set: caches prepared without the key stay valid
        src["hub_config"] = cfg["hub_config"]
    paths: list[Path] = []
    if cfg.get("source") == "files":
        paths = [Path(str(f)).expanduser() for f in cfg.get("files") or []]
    elif cfg.get("source") == "hub" and cfg.get("hub_name"):
        paths = tables.local_paths(cfg["hub_name"])   # a file, a folder, a pattern's files; none for a hub id
    if paths:  # where the data is and its content (sizes, mtimes) must invalidate the cache
        src["stamp"] = [[str(p.resolve()), _tree_stamp(p)] for p in paths if p.exists()]
        if cfg.get("source") == "hub" and any(p.is_dir() for p in paths):
            # a folder's files in no split by their names are read by none now (tables._split_by_name):
            # its caches prepared when they were 'train' hold other blocks
            src["folder_splits"] = 2
    if cfg.get("source") == "stdlib":
        # the interpreter's own library, which differs between Python versions: a cache folder
        # shared by virtualenvs of two Pythons (~/.cache/scalelab) must not serve one the other's
        src["stamp"] = [sysconfig.get_paths()["stdlib"], platform.python_version()]
    src["version"] = PREP_VERSION
    return hashlib.sha1(json.dumps(src, sort_keys=True, default=str).encode()).hexdigest()[:12]


def load_documents(cfg: dict, info: dict | None = None) -> list[tuple[str, bytes]]:
    return list(iter_documents(cfg, info))


def iter_documents(cfg: dict, info: dict | None = None, tmp_root: Path | None = None) -> Iterator[tuple[str, bytes]]:
    """The source's (name, bytes) documents, in order, read one at a time (at most max_documents).
    tmp_root: where local data files' temporary Arrow copy goes (the job's cache folder)."""
    source = cfg["source"]
    if source == "stdlib":
        docs = iter_stdlib_documents()
    elif source == "files":
        docs = iter_file_documents(list(cfg.get("files") or []), info)
    elif source == "hub":
        docs = iter_hub_documents(cfg["hub_name"], cfg.get("hub_split", "train"), cfg.get("text_column", "text"),
                                  cfg.get("hub_config"), info, tmp_root)
    else:
        raise ConfigError(f"data.source={source!r} is not known: choose one of stdlib, files, hub")
    if cfg.get("max_documents"):
        return itertools.islice(docs, int(cfg["max_documents"]))
    return docs

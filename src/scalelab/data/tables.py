"""Local data files in the formats `datasets` reads (JSON Lines, JSON, CSV, Parquet), for the hub
source: `data.hub_name` may be such a file, or a folder of them, besides a hub dataset id and a
folder written by `save_to_disk`. They are loaded with `datasets.load_dataset(FORMAT,
data_files=[...])`, as a `datasets` user would, and the text column is then taken as for any
hub dataset (corpus.hub_documents).

A folder is read recursively, in name order, hidden entries skipped, its .jsonl, .csv and .parquet
files (.jsonl and .csv also .gz, .bz2, .xz, which datasets decompresses as it reads them, in a folder
only where it holds no plain data files; .json only when the file itself is named: a folder's .json
files are as often metadata, e.g. save_to_disk's own state.json, as data). All files of one source have one format. A folder's
files are split by their names as `datasets` splits them (train.jsonl / test.jsonl: data.hub_split
picks one); a single file is the split 'train', as are the files a glob pattern matches
(data.hub_name='shards/train-*.parquet'). text_rows reads a string column's values as UTF-8 bytes
straight from Arrow (for every hub source).
"""
from __future__ import annotations

import glob
import os
import shutil
import socket
import tempfile
from collections.abc import Iterator
from pathlib import Path

from scalelab.errors import ConfigError

#: file extension -> the `datasets` packaged builder that reads it
FORMATS = {".jsonl": "json", ".json": "json", ".csv": "csv", ".parquet": "parquet"}
FOLDER_EXTS = (".jsonl", ".csv", ".parquet")
#: compressed copies `datasets` decompresses as it reads them (notes.jsonl.gz, data/train.csv.xz); Parquet
#: compresses inside its own format
COMPRESSED = (".gz", ".bz2", ".xz")


def data_ext(path: Path) -> str:
    """A data file's format extension: its last suffix, or the one before a compression suffix
    (.jsonl of notes.jsonl.gz); '' for a compressed Parquet file (not a form `datasets` reads)."""
    suffixes = [s.lower() for s in Path(path).suffixes]
    if len(suffixes) >= 2 and suffixes[-1] in COMPRESSED:
        return suffixes[-2] if suffixes[-2] != ".parquet" else ""
    return suffixes[-1] if suffixes else ""


def compressed_copies(files: list[Path]) -> list[Path]:
    """The files among `files` that are another one's compressed copy (notes.jsonl.gz beside
    notes.jsonl): both read, every row of it trained on twice. In the order of `files`."""
    names = set(files)
    return [f for f in files if f.suffix.lower() in COMPRESSED and f.with_suffix("") in names]


def refuse_twins(key: str, files: list[Path]) -> None:
    copies = compressed_copies(files)
    if copies:
        raise ConfigError(f"{key}: {copies[0].with_suffix('')} and {copies[0]} are both in it (a file and its "
                          "compressed copy: every row read twice): keep one of them")


def is_saved_dataset(path: Path) -> bool:
    """A folder written by DatasetDict.save_to_disk (dataset_dict.json) or Dataset.save_to_disk
    (state.json beside its dataset_info.json: a data folder's own state.json, a training job's
    say, made notes.jsonl beside it unreadable as 'not a dataset written by save_to_disk')."""
    return path.is_dir() and ((path / "dataset_dict.json").is_file()
                              or ((path / "state.json").is_file() and (path / "dataset_info.json").is_file()))


def is_pattern(name: str) -> bool:
    """A glob pattern (data/train-*.jsonl, shards/**/*.parquet), not an existing path."""
    return any(c in str(name) for c in "*?[") and not Path(str(name)).expanduser().exists()


def glob_files(name: str) -> list[Path]:
    """The files a glob pattern matches, sorted (hidden names only where the pattern spells the
    dot; ** spans folders), or [] if `name` is no pattern."""
    if not is_pattern(name):
        return []
    return sorted(Path(p) for p in glob.glob(os.path.expanduser(str(name)), recursive=True) if os.path.isfile(p))


def local_paths(name: str) -> list[Path]:
    """The local paths data.hub_name stands for (its cache key follows their content): the file or
    folder, the files a pattern matches; none for a hub id."""
    path = Path(str(name)).expanduser()
    return [path] if path.exists() else glob_files(name)


def data_files(name: str, split: str, info: dict | None = None) -> tuple[str, list[Path]]:
    """(format, files of `split`) of a local data file, of the files a glob pattern matches, or of
    the data files under a folder; ('', []) when a folder holds none. A folder's files are split by
    name as `datasets` splits them (train.jsonl, data/test-00000.parquet, ...; all 'train' where no
    name says otherwise); a file, or a pattern's files, are the split 'train'. A file of another
    kind, a folder or pattern mixing formats or a split that no file makes is a ConfigError.
    `info` (optional) receives `left_out`: a folder's files not read, {what: count} (other splits',
    compressed ones beside plain ones), for prepare's data line."""
    from scalelab.data.text_files import _folder_files

    path = Path(str(name)).expanduser()
    if is_pattern(name):
        files = glob_files(name)
        formats = {FORMATS.get(data_ext(f)) for f in files}
        if None in formats or len(formats) != 1:
            raise ConfigError(f"data.hub_name={str(name)!r} matches {_first([f.name for f in files], 4)}: give a pattern of files of one of "
                              f"{', '.join(FORMATS)} (or {'/'.join(COMPRESSED)} of the first three)")
        fmt = formats.pop()
        splits, unsplit = {"train": files}, []
    elif not path.is_dir():
        fmt = FORMATS.get(data_ext(path))
        if fmt is None:
            raise ConfigError(f"data.hub_name={str(path)!r} is a file but not one of {', '.join(FORMATS)} (or "
                              f"{'/'.join(COMPRESSED)} of the first three; for plain text files use data=text_files "
                              "data.files=[...])")
        splits, unsplit = {"train": [path]}, []
    else:
        found = [f for f in _folder_files(path)[0] if data_ext(f) in FOLDER_EXTS]
        # compressed ones only in a folder of them: beside plain data files (which alone were read before:
        # a stray stats.csv.gz, a file's .gz copy) they are passed over, as they always were
        files = [f for f in found if f.suffix.lower() not in COMPRESSED] or found
        by_format: dict[str, list[str]] = {}
        for f in files:
            by_format.setdefault(FORMATS[data_ext(f)], []).append(f.name)
        if len(by_format) > 1:
            mixed = "; ".join(f"{k}: {_first(v)}" for k, v in by_format.items())
            raise ConfigError(f"data.hub_name={str(path)!r} mixes data file formats ({mixed}): give a folder of one "
                              "format")
        if not files:
            return "", []
        fmt = next(iter(by_format))
        splits = _split_by_name(path, files)
        unsplit = splits.pop(None, [])
        if not splits:
            raise ConfigError(f"data.hub_name={str(path)!r}: none of its data files is in a split by its name")
        if info is not None:   # nothing said they were not read (a test-logs.jsonl is the split 'test')
            left = {f"of the split {k} (data.hub_split={k} reads it)": len(v) for k, v in splits.items() if k != split}
            if unsplit:   # as datasets leaves them out once some file names a split
                left[f"in no split by its name ({_first([f.name for f in unsplit])}; train-*.jsonl and the like are "
                     "the split train)"] = len(unsplit)
            if len(files) < len(found):
                left["compressed, beside plain ones"] = len(found) - len(files)
            info["left_out"] = left
    if is_pattern(name):   # the files it matches are all read: not a file and its compressed copy
        refuse_twins(f"data.hub_name={str(name)!r}", [f for fs in splits.values() for f in fs])
    if split not in splits:
        raise ConfigError(f"data.hub_split={split!r} is not in {name}: its data files make the split(s) "
                          f"{', '.join(splits)}" + (f"; {_first([f.name for f in unsplit])} in none (as datasets reads "
                                                   "a folder once a file's name says a split: name it "
                                                   f"{split}-*{data_ext(unsplit[0])} to read it as {split})"
                                                   if unsplit else ""))
    return fmt, splits[split]


def _first(names: list[str], n: int = 3) -> str:
    """The first N names, and ' ...' where there are more."""
    return ", ".join(names[:n]) + (" ..." if len(names) > n else "")


def _split_by_name(folder: Path, files: list[Path]) -> dict[str | None, list[Path]]:
    """files grouped by split as `datasets` names them from file and folder names (its
    get_data_patterns; no name says a split: all are 'train'). Where some do, a file in no split's
    pattern is in none (key None), as datasets leaves it out: it was 'train' (review 2026-12-04: a
    heldout.jsonl beside train.jsonl and test.jsonl was trained on). All 'train' where datasets'
    rules do not apply."""
    try:
        from datasets.data_files import DataFilesDict, get_data_patterns

        patterns = get_data_patterns(str(folder))
        resolved = DataFilesDict.from_patterns(patterns, base_path=str(folder))
        where = {os.path.realpath(str(f)): str(k) for k, fs in resolved.items() for f in fs}
        # only names that say a split leave a file out (what datasets' catch-all pattern passes over, a
        # file under __pycache__/, stays 'train' as it was)
        named = list(patterns) != ["train"] or any(p != "**" for p in patterns.get("train", []))
    except Exception:  # noqa: BLE001 - its layout rules did not apply: one split
        where, named = {}, False
    out: dict[str | None, list[Path]] = {}
    for f in files:
        out.setdefault(where.get(os.path.realpath(str(f))) if named else "train", []).append(f)
    return out


_TMP_PREFIX = "scalelab-tables-"


def tmp_prefix(prefix: str = _TMP_PREFIX) -> str:
    """PREFIX HOST+PID+: the name of a temporary folder clear_stale can tell is abandoned ('+' is in
    no host name: with '-', host gpu read gpu-12's folder of pid 999999 as its own pid 12)."""
    return f"{prefix}{socket.gethostname()}+{os.getpid()}+"


#: a folder younger than this is never taken for abandoned: two containers of one host name in
#: their own PID namespaces (a shared cache) cannot tell each other's live pids
STALE_AFTER_S = 3600


def clear_stale(folder: Path, prefix: str = _TMP_PREFIX) -> Path:
    """`folder`, made, without the temporary folders (tmp_prefix) of earlier processes on this host
    that are gone (killed, or ended by os._exit on Ctrl-C / SIGTERM: no finalizer ran) and were
    last changed STALE_AFTER_S ago. A folder another host or a live process is writing or reading
    is left alone (a cache shared by a team)."""
    import time

    folder.mkdir(parents=True, exist_ok=True)
    mine = f"{prefix}{socket.gethostname()}+"
    for old in folder.glob(f"{glob.escape(mine)}*+*"):
        pid = old.name[len(mine):].split("+")[0]
        try:
            idle = time.time() - old.stat().st_mtime
        except OSError:
            continue
        if pid.isdigit() and not _alive(int(pid)) and idle > STALE_AFTER_S:
            shutil.rmtree(old, ignore_errors=True)
    return folder


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except OSError:    # another user's: alive
        return True
    return True


def load_files(name: str, fmt: str, files: list[Path], tmp_root: Path | None = None):
    """datasets.load_dataset(fmt, data_files=files, split='train'): a Dataset, memory-mapped from
    its Arrow copy in a temporary folder under TMP_ROOT, the job's cache folder's tmp/ (not $TMPDIR,
    often small or in RAM on a cluster node; not the default cache under $HOME where cache_dir says
    otherwise: review 2026-12-04), removed with the Dataset once its rows are read (prepare caches the blocks;
    a second copy under ~/.cache/huggingface would only take disk). keep_in_memory held the whole
    table in RAM beside the byte stream prepare builds from it."""
    import logging

    import datasets

    from scalelab.paths import cache_dir

    was_off = datasets.is_progress_bar_enabled() is False
    datasets.disable_progress_bars()
    ds_log = logging.getLogger("datasets")
    level = ds_log.level
    ds_log.setLevel(logging.CRITICAL)   # a parse error is logged as well as raised: the one line below instead
    tmp = tempfile.TemporaryDirectory(prefix=tmp_prefix(), dir=clear_stale(Path(tmp_root or cache_dir() / "tmp")),
                                      ignore_cleanup_errors=True)
    try:
        ds = datasets.load_dataset(fmt, data_files=[str(f) for f in files], split="train", cache_dir=tmp.name)
    except Exception as e:  # noqa: BLE001 - a file its reader cannot parse: one line
        tmp.cleanup()
        raise _bad_file(name, fmt, e) from e
    finally:
        ds_log.setLevel(level)
        if not was_off:
            datasets.enable_progress_bars()
    ds._scalelab_tmp = tmp   # its folder goes with the Dataset (TemporaryDirectory's finalizer)
    return ds


def _bad_file(name: str, fmt: str, e: Exception) -> ConfigError:
    cause = e
    while cause.__cause__ is not None and cause.__cause__ is not cause:   # DatasetGenerationError wraps it
        cause = cause.__cause__
    text = " ".join(str(cause).split())[:300]
    if isinstance(cause, StopIteration) and not text:   # datasets' reader of a file with no rows
        text = "no rows: an empty file?"
    return ConfigError(f"data.hub_name={name!r}: its {fmt} data could not be read ({type(cause).__name__}: {text})")


def text_rows(ds, name: str, text_column: str, batch: int = 1024) -> Iterator[tuple[str, bytes]]:
    """(name/row, UTF-8 bytes) of the column's non-empty values, copied straight from the Arrow
    string column's UTF-8 data (the bytes str.encode would give), a batch of rows at a time: not
    the whole column as Python strings and then again as bytes."""
    import numpy as np

    row = 0
    arrow = ds.select_columns([text_column]).with_format("arrow")
    for table in arrow.iter(batch_size=batch):
        for chunk in table.column(0).chunks:
            _, offsets_buf, data_buf = chunk.buffers()
            wide = str(chunk.type) == "large_string"
            offsets = np.frombuffer(offsets_buf, dtype=np.int64 if wide else np.int32)
            offsets = offsets[chunk.offset:chunk.offset + len(chunk) + 1].tolist()
            valid = chunk.is_valid().to_pylist() if chunk.null_count else None
            data = memoryview(data_buf) if data_buf is not None else memoryview(b"")
            for j in range(len(chunk)):
                start, end = offsets[j], offsets[j + 1]
                if end > start and (valid is None or valid[j]):
                    yield f"{name}/{row + j}", bytes(data[start:end])
            row += len(chunk)

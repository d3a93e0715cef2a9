"""The "files" source: local text files and folders (corpus.py's docstring: what is read and skipped).
A .gz / .bz2 / .xz file is read as the text it holds; a file's compressed copy beside it in a folder
is read once, as the file."""
from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path

from scalelab.data.tables import COMPRESSED, compressed_copies, is_pattern, refuse_twins
from scalelab.errors import ConfigError

_BINARY_PROBE = 8192
# notes.txt.gz: read as the text it holds (tables.COMPRESSED's suffixes, by the stdlib module of each)
_DECOMPRESS = dict(zip(COMPRESSED, ("gzip", "bz2", "lzma")))


def pattern_refusal(raw) -> str:
    """The line for a glob pattern in data.files (config.validate's existence check comes first)."""
    return (f"data.files: {raw!r} is a pattern: data=text_files reads files and folders (give the folder: its text "
            "files are read, recursively); data=hub data.hub_name takes a pattern of .jsonl/.csv/.parquet files")


def _unreadable(p: Path, e: OSError) -> ConfigError:
    return ConfigError(f"data.files: {p} cannot be read ({e.strerror or type(e).__name__}): make it readable, or "
                       "move it out of the data")


def _read_file(p: Path) -> bytes | None:
    """A text file's bytes; a .gz / .bz2 / .xz file's decompressed, as a stream: where its first
    _BINARY_PROBE bytes hold a NUL (a .pt.gz, a .tar.gz: not text) only those are returned, not
    the whole file inflated to be skipped. None where it does not decompress (not text either)."""
    codec = _DECOMPRESS.get(p.suffix.lower())
    if codec is None:
        try:
            return p.read_bytes()
        except OSError as e:   # a traceback before (review 2026-12-04: a file of a folder without read permission)
            raise _unreadable(p, e) from e
    import importlib
    import lzma
    import zlib

    try:
        raw = open(p, "rb")
    except OSError as e:   # the file itself, not its codec's "not mine" below
        raise _unreadable(p, e) from e
    try:
        with raw, importlib.import_module(codec).open(raw, "rb") as f:
            head = f.read(_BINARY_PROBE)
            if b"\x00" in head:
                return head
            out = bytearray(head)
            while chunk := f.read(1 << 22):
                out += chunk
        return bytes(out)
    except (OSError, EOFError, ValueError, zlib.error, lzma.LZMAError):   # each codec's "not mine"
        return None


def _folder_files(folder: Path) -> tuple[list[Path], list[Path]]:
    """Files under a folder, recursively, in a stable order, without hidden entries (names starting
    with "."); and the files those hidden entries held. Symlinked folders are followed, each real
    folder walked once (a link back up the tree, or two links to one folder, are not walked again)."""
    files: list[Path] = []
    seen_dirs: set[str] = set()
    for here, dirs, names in os.walk(folder, followlinks=True):
        real = os.path.realpath(here)
        if real in seen_dirs:
            dirs[:] = []      # already walked (a cycle, or another link to it): neither its files nor below
            continue
        seen_dirs.add(real)
        dirs.sort()           # walk in name order, so which of two links is walked is stable
        files.extend(f for f in (Path(here) / n for n in names) if f.is_file())
    hidden = [f for f in files if any(part.startswith(".") for part in f.relative_to(folder).parts)]
    hidden_set = set(hidden)
    return sorted(f for f in files if f not in hidden_set), hidden


def file_documents(paths: list[str], info: dict | None = None) -> list[tuple[str, bytes]]:
    """(name, bytes) of every text file given or found under a given folder. `info` (optional)
    receives the counts of files read and skipped (empty, binary and, where there were any, hidden
    and duplicate: a file reached again, by a second name or link, after it was read)."""
    return list(iter_file_documents(paths, info))


def iter_file_documents(paths: list[str], info: dict | None = None) -> Iterator[tuple[str, bytes]]:
    """file_documents, one file at a time (prepare keeps none of them: each goes into the stream)."""
    docs, skipped = 0, {"empty": 0, "binary": 0}
    any_text = False
    # resolved paths read (or skipped) already, a compressed file as the file it holds (notes.txt.gz as
    # notes.txt): a file reached twice counts once, and so does a folder's file and its copy named beside
    # it (data.files=[tf,tf/notes.txt.gz] read the text twice: found by review)
    seen: set[Path] = set()

    def first_time(f: Path) -> bool:
        real = f.resolve()
        if real.suffix.lower() in COMPRESSED:
            real = real.with_suffix("")
        if real in seen:
            return False
        seen.add(real)
        return True

    duplicates = 0
    hidden_seen: set[Path] = set()

    def note() -> None:   # before each yield too: data.max_documents stops this generator early
        if info is not None:
            info.update(files=docs, skipped_files={**skipped, **({"duplicate": duplicates} if duplicates else {})})

    # two named files, one the other's compressed copy: every row read twice (a folder reads the file alone)
    refuse_twins("data.files", [Path(str(raw)).expanduser() for raw in paths])
    for raw in paths:
        p = Path(str(raw)).expanduser()
        if not p.exists() and is_pattern(str(raw)):
            raise ConfigError(pattern_refusal(raw))
        if not p.exists():
            raise ConfigError(f"data.files: {raw!r} does not exist (give existing text files or folders)")
        if not p.is_dir():   # named: read, or said why not (a folder's empty and binary files are skipped)
            if not first_time(p):
                duplicates += 1
                continue
            data = _read_file(p)
            if data is None:
                raise ConfigError(f"data.files: {raw!r} does not decompress as its name says ({p.suffix}): give "
                                  "text files or folders, plain or .gz/.bz2/.xz")
            if not data:
                raise ConfigError(f"data.files: {raw!r} is empty (give text files or folders)")
            if b"\x00" in data[:_BINARY_PROBE]:
                hint = f"; a data file: data=hub data.hub_name={raw}" if p.suffix.lower() == ".parquet" else ""
                raise ConfigError(f"data.files: {raw!r} is not text (a NUL byte in its first {_BINARY_PROBE} bytes; "
                                  f"give text files or folders{hint})")
            docs += 1
            any_text = True
            note()
            yield str(p), data
            continue
        found, hidden = _folder_files(p)
        copies = set(compressed_copies(found))   # notes.txt.gz beside notes.txt: the file alone
        new_hidden = {f.resolve() for f in hidden} - hidden_seen
        if new_hidden:
            hidden_seen |= new_hidden
            skipped["hidden"] = skipped.get("hidden", 0) + len(new_hidden)
        for f in found:
            if f in copies or not first_time(f):
                duplicates += 1
                continue
            data = _read_file(f)
            if data is not None and not data:
                skipped["empty"] += 1
            elif data is None or b"\x00" in data[:_BINARY_PROBE]:   # (one that does not decompress: not text)
                skipped["binary"] += 1
            else:
                docs += 1
                any_text = True
                note()
                yield str(f), data
    note()
    if duplicates:
        skipped["duplicate"] = duplicates
    if not any_text:
        raise ConfigError(f"data.files: no text found in {list(map(str, paths))!r} "
                          f"(skipped {skipped['empty']} empty and {skipped['binary']} binary files)")

"""Review fixes in the data code: a hub column that is not text is an error (not trained on as its
Python repr); symlinked folders are followed, each file read once; the split does not depend on how
a local path is spelled (the embedded stdlib corpus keeps its split)."""
from __future__ import annotations

import itertools
import os
import time
from pathlib import Path

import datasets
import numpy as np

import pytest

from scalelab.data import corpus, text_files
from scalelab.data.prepare import prepare, read_meta
from scalelab.errors import ConfigError

T = 16  # blocks of 17 bytes


def files_cfg(*paths, val_fraction=0.02) -> dict:
    return {"source": "files", "files": [str(p) for p in paths], "val_fraction": val_fraction, "max_documents": None}


def two_files(folder):
    """folder/ with two text files of 40 and 60 bytes."""
    folder.mkdir(parents=True)
    (folder / "x.txt").write_text("x" * 40)
    (folder / "y.txt").write_text("y" * 60)
    return folder


def read(paths) -> tuple[list[str], dict]:
    info: dict = {}
    docs = text_files.file_documents([str(p) for p in paths], info)
    return [os.path.basename(name) for name, _ in docs], info


# ---------------------------------------------------------------- 1. a hub column that is not text


@pytest.fixture
def saved(tmp_path):
    path = tmp_path / "ds"
    datasets.Dataset.from_dict({"story": ["once upon a time", None, "the end"], "n": [1, 2, 3],
                                "toks": [[1, 2], [3], []]}).save_to_disk(str(path))
    return str(path)


def test_an_int_column_is_an_error_naming_it_and_the_string_columns(saved):
    with pytest.raises(ConfigError, match=r"^data.text_column='n' in .*ds holds int64 values, not text; "
                                          r"choose a string column: story$"):
        corpus.hub_documents(saved, "train", "n")   # was: documents b'1', b'2', b'3'


def test_a_list_column_is_an_error(saved):
    with pytest.raises(ConfigError, match=r"^data.text_column='toks' in .* holds List\(.*int64.*\) values, "
                                          r"not text; choose a string column: story$"):
        corpus.hub_documents(saved, "train", "toks")   # was: documents b'[1, 2]', b'[3]'


def test_a_dataset_without_a_string_column_says_so(tmp_path):
    datasets.Dataset.from_dict({"n": [1, 2]}).save_to_disk(str(tmp_path / "nums"))
    with pytest.raises(ConfigError, match=r"holds int64 values, not text; it has no string column$"):
        corpus.hub_documents(str(tmp_path / "nums"), "train", "n")


def test_a_string_column_still_reads_its_rows_and_skips_nulls(saved):
    docs = corpus.hub_documents(saved, "train", "story")
    assert [d for _, d in docs] == [b"once upon a time", b"the end"]


# ---------------------------------------------------------------- 2. symlinked folders, files reached twice


def test_a_folder_holding_only_a_link_to_a_folder_reads_its_files(tmp_path):
    two_files(tmp_path / "a")
    (tmp_path / "root").mkdir()
    (tmp_path / "root" / "b").symlink_to(tmp_path / "a", target_is_directory=True)
    names, info = read([tmp_path / "root"])          # was: no text found (0 documents)
    assert names == ["x.txt", "y.txt"] and info["files"] == 2
    meta = read_meta(prepare(files_cfg(tmp_path / "root"), T, tmp_path / "cache", progress=False))
    assert meta["documents"] == 2 and meta["bytes"] == 100 and meta["blocks"] == (100 + 1) // 17


def test_a_folder_and_a_link_to_it_are_read_once(tmp_path):
    root = tmp_path / "root"
    two_files(root / "a")
    (root / "b").symlink_to(root / "a", target_is_directory=True)
    names, info = read([root])
    assert names == ["x.txt", "y.txt"] and info["files"] == 2   # not 4: b/ is a second way to a/


def test_a_folder_named_twice_or_by_a_link_is_read_once_in_first_order(tmp_path):
    a = two_files(tmp_path / "a")
    (tmp_path / "b").symlink_to(a, target_is_directory=True)
    (tmp_path / "z.txt").write_text("z" * 30)
    names, info = read([tmp_path / "z.txt", a, tmp_path / "b", a, tmp_path / "z.txt"])   # was: 7 documents
    assert names == ["z.txt", "x.txt", "y.txt"] and info["files"] == 3
    assert info["skipped_files"]["duplicate"] == 5   # b/x, b/y, a/x, a/y again, z.txt again


def test_a_link_to_a_file_already_read_is_read_once(tmp_path):
    a = two_files(tmp_path / "a")
    (a / "w.txt").symlink_to(a / "y.txt")
    names, info = read([a])
    assert names == ["w.txt", "x.txt"] and info["files"] == 2   # y.txt is w.txt: one document


def test_a_link_cycle_ends_and_each_file_is_read_once(tmp_path):
    a = two_files(tmp_path / "a")
    (a / "sub").mkdir()
    (a / "sub" / "s.txt").write_text("s" * 20)
    (a / "sub" / "up").symlink_to(a, target_is_directory=True)   # a/sub/up -> a: a cycle
    names, info = read([a])
    assert names == ["s.txt", "x.txt", "y.txt"] and info["files"] == 3


def test_hidden_and_empty_files_behind_a_link_are_skipped_and_counted_once(tmp_path):
    a = two_files(tmp_path / "a")
    (a / "e.txt").write_bytes(b"")
    (a / ".cfg").write_text("hidden")
    root = tmp_path / "root"
    root.mkdir()
    (root / "l1").symlink_to(a, target_is_directory=True)
    (root / "l2").symlink_to(a, target_is_directory=True)
    names, info = read([root, a])
    assert names == ["x.txt", "y.txt"]
    assert info["skipped_files"] == {"empty": 1, "binary": 0, "hidden": 1, "duplicate": 3}


def test_no_links_no_duplicates_is_counted_as_before(tmp_path):
    a = two_files(tmp_path / "a")
    names, info = read([a])
    assert names == ["x.txt", "y.txt"] and info["skipped_files"] == {"empty": 0, "binary": 0}


# ---------------------------------------------------------------- 3. the split seed and the spelling of paths


def test_the_split_seed_does_not_depend_on_how_a_path_is_spelled(tmp_path, monkeypatch):
    data = two_files(tmp_path / "data")
    (tmp_path / "link").symlink_to(data, target_is_directory=True)
    monkeypatch.chdir(tmp_path)
    seeds = {corpus.split_seed(files_cfg(p)) for p in ("data", "./data", "data/", str(data), "sub/../data", "link")}
    assert len(seeds) == 1, seeds   # was: a different split for each spelling
    assert corpus.split_seed(files_cfg("data")) != corpus.split_seed(files_cfg("data/x.txt"))


def test_the_same_relative_files_in_two_checkouts_split_alike(tmp_path, monkeypatch):
    """A review of the resolved-path seed: the same command in /m1/proj and /m2/other/proj (two
    users, two nodes of one job) split the same files apart. Inside the working directory a
    path counts relative to it; outside, resolved."""
    seeds = []
    for root in (tmp_path / "m1" / "proj", tmp_path / "m2" / "other" / "proj"):
        two_files(root / "data")
        monkeypatch.chdir(root)
        seeds.append((corpus.split_seed(files_cfg("data")), corpus.split_seed(files_cfg(str(root / "data")))))
    assert seeds[0][0] == seeds[1][0] and seeds[0] == (seeds[0][0], seeds[0][0])
    outside = two_files(tmp_path / "shared")                    # not under the working directory: resolved
    assert corpus.split_seed(files_cfg(str(outside))) == corpus.split_seed(files_cfg("../../../shared"))


def test_a_local_hub_folder_seed_does_not_depend_on_spelling(tmp_path, monkeypatch):
    datasets.Dataset.from_dict({"text": ["a b c"]}).save_to_disk(str(tmp_path / "ds"))
    monkeypatch.chdir(tmp_path)
    cfg = {"source": "hub", "hub_split": "train", "text_column": "text", "max_documents": None}
    assert (corpus.split_seed({**cfg, "hub_name": "ds"}) == corpus.split_seed({**cfg, "hub_name": "./ds"})
            == corpus.split_seed({**cfg, "hub_name": str(tmp_path / "ds")}))


def test_two_spellings_prepare_the_same_split(tmp_path, monkeypatch):
    (tmp_path / "data").mkdir()
    (tmp_path / "data" / "notes.txt").write_text("".join(f"{i}: line of text\n" for i in range(300)))
    monkeypatch.chdir(tmp_path)
    a = prepare(files_cfg("./data", val_fraction=0.1), T, tmp_path / "c1", progress=False)
    b = prepare(files_cfg(tmp_path / "data", val_fraction=0.1), T, tmp_path / "c2", progress=False)
    assert read_meta(a)["split_seed"] == read_meta(b)["split_seed"]
    val = [np.asarray(datasets.load_from_disk(str(d / "val"))["input_ids"]) for d in (a, b)]
    assert len(val[0]) == round(read_meta(a)["blocks"] * 0.1) and np.array_equal(val[0], val[1])


def test_the_embedded_stdlib_split_is_unchanged_and_caches_are_renewed():
    """The default corpus keeps its split (seed as before this change: loss figures stay comparable);
    the prepared-data version moved on, so caches made with the old seeds or file lists are not reused."""
    stdlib = {"source": "stdlib", "global_batch_size": 16, "micro_batch_size": None, "val_fraction": 0.02,
              "max_documents": None, "num_workers": 0, "pin_memory": "auto"}
    assert corpus.split_seed(stdlib) == 3391036487233253780
    assert corpus.split_seed({"source": "hub", "hub_name": "owner/name", "hub_split": "train",
                              "text_column": "text"}) == corpus.split_seed(
        {"source": "hub", "hub_name": "owner/name", "hub_split": "train", "text_column": "text"})
    assert corpus.PREP_VERSION >= 3


def test_a_missing_local_data_file_is_one_line_without_the_hub(tmp_path, monkeypatch):
    """notes.jsonl run from the wrong folder: was taken for a hub id (~25 s of retries offline,
    then 'Couldn't reach notes.jsonl on the Hub')."""
    monkeypatch.chdir(tmp_path)
    (tmp_path / "data").mkdir()
    for name in ("notes.jsonl", "data/train.PARQUET", "x.csv"):
        with pytest.raises(ConfigError) as e:
            corpus.hub_kind(name)
        assert str(e.value).startswith(f"data.hub_name={name!r} is neither an existing folder or file")
        assert f"relative paths from {tmp_path}) nor a hub dataset name" in str(e.value)
    assert corpus.hub_kind("roneneldan/TinyStories") == "hub" and corpus.hub_kind("wikitext") == "hub"
    assert corpus.hub_kind("owner/corpus.csv") == "hub"     # a hub name may end so (no owner/ folder here)


def test_a_killed_prepares_arrow_copy_is_cleared_by_the_next(tmp_path, monkeypatch):
    """The copy of local data files lives under the cache's tmp/ while prepare reads it; a prepare
    killed (or ended by os._exit) leaves it: the next load removes this host's copies whose process
    is gone, and keeps a live one's."""
    import socket
    import subprocess

    from scalelab.data import tables

    monkeypatch.setenv("SCALELAB_CACHE", str(tmp_path / "cache"))
    dead = subprocess.Popen(["true"])
    dead.wait()
    host = socket.gethostname()
    tmp = tmp_path / "cache" / "tmp"
    gone = tmp / f"scalelab-tables-{host}+{dead.pid}+abc"
    live = tmp / f"scalelab-tables-{host}+{os.getpid()}+def"
    other = tmp / "scalelab-tables-otherhost+1+ghi"
    longer = tmp / f"scalelab-tables-{host}-12+{dead.pid}+jkl"     # host HOST-12's: not this host's
    young = tmp / f"scalelab-tables-{host}+{dead.pid}+mno"         # changed within the hour: left
    for d in (gone, live, other, longer, young):
        (d / "x").mkdir(parents=True)
        if d is not young:
            os.utime(d, (time.time() - 2 * tables.STALE_AFTER_S,) * 2)
    (tmp_path / "n.jsonl").write_text('{"text": "ab"}\n')
    ds = tables.load_files("n.jsonl", "json", [tmp_path / "n.jsonl"])
    assert ds["text"] == ["ab"]
    assert not gone.exists() and live.exists() and other.exists() and longer.exists() and young.exists()
    mine = Path(ds._scalelab_tmp.name)
    assert mine.parent == tmp and mine.name.startswith(f"scalelab-tables-{host}+{os.getpid()}+")
    del ds
    import gc
    gc.collect()
    assert not mine.exists()


def test_max_documents_keeps_the_files_read_in_the_info(tmp_path):
    """data.max_documents stops the (streaming) reader early: its info said nothing then (meta.json
    lost files and skipped_files)."""
    folder = tmp_path / "d"
    folder.mkdir()
    (folder / "a_empty.txt").write_text("")
    for name in ("b.txt", "c.txt", "d.txt"):
        (folder / name).write_text(name * 10)
    info = {}
    docs = list(itertools.islice(text_files.iter_file_documents([str(folder)], info), 2))
    assert [Path(n).name for n, _ in docs] == ["b.txt", "c.txt"]
    assert info == {"files": 2, "skipped_files": {"empty": 1, "binary": 0}}

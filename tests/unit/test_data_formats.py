"""Users' own data in the formats `datasets` reads: a local .jsonl / .json / .csv / .parquet file,
or a folder of them, as data.hub_name (loaded with datasets.load_dataset(FORMAT, data_files=...),
its text_column checked as a hub dataset's), and a hub dataset's configuration (data.hub_config,
e.g. wikitext-2-raw-v1), in the cache key and the split seed. No network: files in tmp_path, and
load_dataset replaced where a hub id is loaded."""
from __future__ import annotations

import json
import os
import time

import datasets
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from scalelab import schema
from scalelab.data import corpus, tables, text_files
from scalelab.data.prepare import prepare, prepared_dir, read_meta
from scalelab.errors import ConfigError
from scalelab.preflight import preflight


def hub_cfg(name, **kw) -> dict:
    return {"source": "hub", "hub_name": str(name), "hub_split": "train", "text_column": "text",
            "val_fraction": 0.25, "max_documents": None, **kw}


def jsonl(path, rows) -> str:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return str(path)


def blocks_of(prepared) -> list[bytes]:
    """The prepared train and val blocks, as bytes, in stream order (val blocks by their index)."""
    meta = read_meta(prepared)
    out = []
    for split in ("train", "val"):
        if (prepared / split).exists():
            out += [bytes(r) for r in datasets.load_from_disk(str(prepared / split))["input_ids"]]
    assert len(out) == meta["blocks"]
    return out


# ---------------------------------------------------------------- the formats


def test_a_jsonl_file_yields_its_text_column(tmp_path):
    f = jsonl(tmp_path / "notes.jsonl", [{"text": "ab", "id": 1}, {"text": "cd", "id": 2}, {"text": "ef", "id": 3}])
    assert corpus.hub_documents(f, "train", "text") == [(f"{f}/0", b"ab"), (f"{f}/1", b"cd"), (f"{f}/2", b"ef")]
    # the stream ab\0cd\0ef cut into blocks of 2 bytes (seq_len 1): 4 blocks, 1 held out (val_fraction 0.25)
    out = prepare(hub_cfg(f), 1, tmp_path / "cache", progress=False)
    meta = read_meta(out)
    counts = (meta["documents"], meta["bytes"], meta["blocks"], meta["train_blocks"], meta["val_blocks"])
    assert counts == (3, 6, 4, 3, 1)
    assert sorted(blocks_of(out)) == sorted([b"ab", b"\x00c", b"d\x00", b"ef"])


def test_a_json_array_a_csv_and_a_parquet_file(tmp_path):
    (tmp_path / "a.json").write_text(json.dumps([{"body": "héllo"}, {"body": ""}, {"body": "x"}]))
    assert [d for _, d in corpus.hub_documents(str(tmp_path / "a.json"), "train", "body")] == [
        "héllo".encode(), b"x"]   # the empty row is no document
    (tmp_path / "b.csv").write_text('id,body\n1,ab\n2,"c,d"\n3,\n4,ef\n')
    assert [d for _, d in corpus.hub_documents(str(tmp_path / "b.csv"), "train", "body")] == [b"ab", b"c,d", b"ef"]
    pq.write_table(pa.table({"t": ["ab", None, "cd"], "n": [1, 2, 3]}), tmp_path / "c.parquet")
    assert corpus.hub_documents(str(tmp_path / "c.parquet"), "train", "t") == [
        (f"{tmp_path}/c.parquet/0", b"ab"), (f"{tmp_path}/c.parquet/2", b"cd")]


def test_a_folder_of_data_files_is_split_by_file_name_as_datasets_does(tmp_path):
    d = tmp_path / "corpus"
    jsonl(d / "train.jsonl", [{"text": "t1"}, {"text": "t2"}])
    jsonl(d / "test.jsonl", [{"text": "e1"}])
    jsonl(d / ".hidden.jsonl", [{"text": "no"}])
    (d / "README.md").write_text("not data")
    assert [x for _, x in corpus.hub_documents(str(d), "train", "text")] == [b"t1", b"t2"]
    assert [x for _, x in corpus.hub_documents(str(d), "test", "text")] == [b"e1"]
    with pytest.raises(ConfigError, match=r"^data.hub_split='validation' is not in .*corpus: its data files make "
                                          r"the split\(s\) test, train$"):
        corpus.hub_documents(str(d), "validation", "text")
    # no split in the names: every file, recursively, in name order, is 'train'
    s = tmp_path / "shards"
    jsonl(s / "b" / "part-1.jsonl", [{"text": "b1"}])
    jsonl(s / "a.jsonl", [{"text": "a1"}])
    assert [x for _, x in corpus.hub_documents(str(s), "train", "text")] == [b"a1", b"b1"]
    # where names say splits, a file in none is read by no split, as datasets.load_dataset(folder) does
    # (review 2026-12-04: heldout.jsonl beside train.jsonl and test.jsonl was trained on), and it is said
    jsonl(d / "heldout.jsonl", [{"text": "h1"}])
    info: dict = {}
    assert [f.name for f in tables.data_files(str(d), "train", info)[1]] == ["train.jsonl"]
    assert [x for _, x in corpus.hub_documents(str(d), "train", "text")] == [b"t1", b"t2"]
    assert info["left_out"]["in no split by its name (heldout.jsonl; train-*.jsonl and the like are the split "
                            "train)"] == 1
    assert dict(datasets.load_dataset(str(d)).num_rows) == {"train": 2, "test": 1}   # the rule it follows
    # no name says a split: what datasets' catch-all pattern passes over (under __cache__/) stays train
    jsonl(s / "__cache__" / "c.jsonl", [{"text": "c1"}])
    info = {}
    assert [f.name for f in tables.data_files(str(s), "train", info)[1]] == ["c.jsonl", "a.jsonl", "part-1.jsonl"]
    assert info["left_out"] == {}


# ---------------------------------------------------------------- bad values: one line each


def test_a_missing_text_column_lists_the_columns(tmp_path):
    f = jsonl(tmp_path / "x.jsonl", [{"body": "ab", "id": 1}])
    with pytest.raises(ConfigError, match=r"^data.text_column='text' not in .*x.jsonl: choose one of "
                                          r"\['body', 'id'\]$"):
        corpus.hub_documents(f, "train", "text")


def test_a_number_column_of_a_csv_is_not_text(tmp_path):
    (tmp_path / "n.csv").write_text("id,body\n1,ab\n2,cd\n")
    with pytest.raises(ConfigError, match=r"^data.text_column='id' in .*n.csv holds int64 values, not text; "
                                          r"choose a string column: body$"):
        corpus.hub_documents(str(tmp_path / "n.csv"), "train", "id")


@pytest.mark.parametrize("name,content,expected", [
    ("bad.jsonl", '{"text": "ab"}\nnot json\n', r"^data.hub_name='.*bad.jsonl': its json data could not be read "
                                                 r"\(ArrowInvalid: JSON parse error"),
    ("notes.txt", "plain text", r"^data.hub_name='.*notes.txt' is a file but not one of \.jsonl, \.json, \.csv, "
                                r"\.parquet \(or \.gz/\.bz2/\.xz of the first three; for plain text files use "
                                r"data=text_files data.files=\[...\]\)$"),
])
def test_a_file_it_cannot_read_is_one_line(tmp_path, name, content, expected):
    (tmp_path / name).write_text(content)
    with pytest.raises(ConfigError, match=expected) as e:
        corpus.hub_documents(str(tmp_path / name), "train", "text")
    assert "\n" not in str(e.value)


def test_a_single_file_is_the_train_split_and_formats_do_not_mix(tmp_path):
    f = jsonl(tmp_path / "one.jsonl", [{"text": "ab"}])
    with pytest.raises(ConfigError, match=r"^data.hub_split='test' is not in .*one.jsonl: its data files make the "
                                          r"split\(s\) train$"):
        corpus.hub_documents(f, "test", "text")
    d = tmp_path / "mixed"
    jsonl(d / "a.jsonl", [{"text": "ab"}])
    (d / "b.csv").write_text("text\ncd\n")
    with pytest.raises(ConfigError, match=r"^data.hub_name='.*mixed' mixes data file formats \(json: a.jsonl; "
                                          r"csv: b.csv\): give a folder of one format$"):
        corpus.hub_documents(str(d), "train", "text")


def test_a_parquet_file_given_as_text_says_where_it_goes(tmp_path):
    pq.write_table(pa.table({"text": ["ab"]}), tmp_path / "c.parquet")
    with pytest.raises(ConfigError, match=r"is not text .*; a data file: data=hub data.hub_name=.*c.parquet\)$"):
        text_files.file_documents([str(tmp_path / "c.parquet")])


def test_a_save_to_disk_folder_and_a_folder_without_data_keep_their_behaviour(tmp_path):
    datasets.Dataset.from_dict({"text": ["ab", "cd"]}).save_to_disk(str(tmp_path / "saved"))
    assert [x for _, x in corpus.hub_documents(str(tmp_path / "saved"), "train", "text")] == [b"ab", b"cd"]
    (tmp_path / "plain").mkdir()
    (tmp_path / "plain" / "a.txt").write_text("text")
    with pytest.raises(ConfigError, match=r"is a folder but not a dataset written by save_to_disk .* nor holds "
                                          r"\.jsonl, \.csv, \.parquet files; for plain text files use data=text_files"):
        corpus.hub_documents(str(tmp_path / "plain"), "train", "text")


# ---------------------------------------------------------------- the cache key and the split seed


def test_a_data_files_content_and_path_are_in_the_cache_key(tmp_path):
    f = jsonl(tmp_path / "x.jsonl", [{"text": "ab"}])
    before = prepared_dir(hub_cfg(f), 1, tmp_path)
    assert prepared_dir(hub_cfg(f), 1, tmp_path) == before
    jsonl(tmp_path / "x.jsonl", [{"text": "abc"}])   # new size
    after = prepared_dir(hub_cfg(f), 1, tmp_path)
    assert after != before
    st = os.stat(f)
    os.utime(f, ns=(st.st_atime_ns, st.st_mtime_ns + 10**9))   # same size, new mtime
    assert prepared_dir(hub_cfg(f), 1, tmp_path) != after
    # revised with its size and mtime kept (cp -p, rsync -t, tar x): served stale before (review 2026-12-04)
    kept = prepared_dir(hub_cfg(f), 1, tmp_path)
    st = os.stat(f)
    time.sleep(0.01)
    jsonl(tmp_path / "x.jsonl", [{"text": "xyz"}])
    os.utime(f, ns=(st.st_atime_ns, st.st_mtime_ns))
    assert (os.stat(f).st_size, os.stat(f).st_mtime_ns) == (st.st_size, st.st_mtime_ns)
    assert prepared_dir(hub_cfg(f), 1, tmp_path) != kept
    d = tmp_path / "d"
    jsonl(d / "a.jsonl", [{"text": "ab"}])
    key = prepared_dir(hub_cfg(d), 1, tmp_path)
    time.sleep(0.01)
    jsonl(d / "sub" / "b.jsonl", [{"text": "cd"}])   # a file added under the folder
    assert prepared_dir(hub_cfg(d), 1, tmp_path) != key


def test_hub_config_is_in_the_cache_key_and_split_seed_only_when_set(tmp_path):
    base = hub_cfg("wikitext")
    plain = prepared_dir(base, 64, tmp_path)
    assert prepared_dir({**base, "hub_config": None}, 64, tmp_path) == plain   # caches made before the key stay valid
    assert corpus.split_seed({**base, "hub_config": None}) == corpus.split_seed(base)
    raw = prepared_dir({**base, "hub_config": "wikitext-2-raw-v1"}, 64, tmp_path)
    other = prepared_dir({**base, "hub_config": "wikitext-103-raw-v1"}, 64, tmp_path)
    assert len({plain, raw, other}) == 3
    assert len({corpus.split_seed({**base, "hub_config": c}) for c in (None, "a", "b")}) == 3


# ---------------------------------------------------------------- hub_config reaches load_dataset


@pytest.fixture
def fake_hub(monkeypatch):
    """datasets.load_dataset for hub ids, recording its arguments: wikitext has two configurations."""
    calls = []

    def load_dataset(path, name=None, split=None, **kw):
        calls.append((path, name, split))
        if name not in ("wikitext-2-raw-v1", "wikitext-103-raw-v1"):
            raise ValueError(f"BuilderConfig {name!r} not found. Available: ['wikitext-103-raw-v1', "
                             "'wikitext-2-raw-v1']")
        return datasets.Dataset.from_dict({"text": [f"{name} one", "", f"{name} two"]})

    monkeypatch.setattr(datasets, "load_dataset", load_dataset)
    return calls


def test_hub_config_is_passed_to_load_dataset(tmp_path, fake_hub):
    docs = corpus.hub_documents("wikitext", "train", "text", "wikitext-2-raw-v1")
    assert fake_hub == [("wikitext", "wikitext-2-raw-v1", "train")]
    assert docs == [("wikitext/0", b"wikitext-2-raw-v1 one"), ("wikitext/2", b"wikitext-2-raw-v1 two")]
    meta = read_meta(prepare(hub_cfg("wikitext", hub_config="wikitext-103-raw-v1"), 3, tmp_path, progress=False))
    assert fake_hub[-1] == ("wikitext", "wikitext-103-raw-v1", "train")
    assert meta["documents"] == 2 and meta["bytes"] == 2 * len("wikitext-103-raw-v1 one")


def test_a_bad_hub_config_is_one_line_naming_it(fake_hub):
    with pytest.raises(ConfigError, match=r"^data.hub_config='nope': ValueError: BuilderConfig 'nope' not found. "
                                          r"Available: \['wikitext-103-raw-v1', 'wikitext-2-raw-v1'\]"):
        corpus.hub_documents("wikitext", "train", "text", "nope")
    with pytest.raises(ConfigError, match=r"^data.hub_name='wikitext': ValueError: BuilderConfig None not found.* "
                                          r"\(set data.hub_config=NAME\)"):
        corpus.hub_documents("wikitext", "train", "text")


def test_hub_config_with_a_local_path_is_an_error(tmp_path):
    f = jsonl(tmp_path / "x.jsonl", [{"text": "ab"}])
    with pytest.raises(ConfigError, match=r"^data.hub_config='cfg' names a configuration of a hub dataset; .*x.jsonl "
                                          r"is a local path \(set data.hub_config=null\)$"):
        corpus.hub_documents(f, "train", "text", "cfg")


# ---------------------------------------------------------------- the config: schema and preflight


def test_the_schema_knows_hub_config():
    schema.check({"data": {"source": "hub", "hub_name": "wikitext", "hub_config": "wikitext-2-raw-v1"}})
    schema.check({"data": {"source": "hub", "hub_name": "wikitext", "hub_config": None}})
    with pytest.raises(ConfigError, match=r"^data.hub_config=3 must be a non-empty string or null"):
        schema.check({"data": {"source": "hub", "hub_name": "wikitext", "hub_config": 3}})


def test_preflight_prepares_a_jsonl_file(tmp_path, monkeypatch):
    monkeypatch.setenv("SCALELAB_CACHE", str(tmp_path / "cache"))
    # 40 records of 64 bytes + 39 separators: 2599 bytes, 39 blocks of 65 (1 val) < 64: too small
    f = jsonl(tmp_path / "data.jsonl", [{"story": f"{i:02d}" + "x" * 62} for i in range(40)])
    with pytest.raises(ConfigError, match=r"^data: the corpus yields 38 training blocks of 65 bytes, fewer than one "
                                          r"global batch of 64"):
        preflight(["data=hub", f"data.hub_name={f}", "data.text_column=story", "data.global_batch_size=64",
                   "model=gpt_nano"])
    assert preflight(["data=hub", f"data.hub_name={f}", "data.text_column=story", "data.global_batch_size=16",
                      "model=gpt_nano"]) == 1
    (prepared,) = (tmp_path / "cache" / "data").iterdir()
    assert read_meta(prepared)["documents"] == 40 and read_meta(prepared)["bytes"] == 40 * 64


# ---------------------------------------------------------------- preparing holds the corpus once


@pytest.mark.parametrize("large", [False, True])
def test_text_rows_are_the_utf8_of_each_non_empty_value_across_batches(large):
    """Rows copied from Arrow's UTF-8 data equal str.encode of each value, across batch and chunk
    boundaries (sliced chunks: a non-zero offset), nulls and empty strings skipped."""
    values = [None if i % 7 == 0 else "" if i % 11 == 0 else f"ré{i}" * (i % 5) for i in range(2500)]
    typ = pa.large_string() if large else pa.string()
    table = pa.Table.from_batches([pa.record_batch([pa.array(values[:1300], typ)], names=["t"]),
                                   pa.record_batch([pa.array(values[1300:], typ)], names=["t"])])
    ds = datasets.Dataset(table)
    expected = [(f"ds/{i}", v.encode()) for i, v in enumerate(values) if v]
    assert list(tables.text_rows(ds, "ds", "t", batch=1000)) == expected
    assert list(tables.text_rows(ds.select(range(3, 2500, 2)), "ds", "t", batch=1000)) == [
        (f"ds/{j}", v.encode()) for j, v in enumerate(values[3::2]) if v]


def test_take_val_moves_the_train_rows_in_place():
    import numpy as np

    from scalelab.data.prepare import take_val

    blocks = np.arange(10 * 3, dtype=np.uint8).reshape(10, 3)
    before = blocks.copy()
    train, val = take_val(blocks, np.array([0, 1, 4, 9]))
    assert val.tolist() == before[[0, 1, 4, 9]].tolist()
    assert train.tolist() == before[[2, 3, 5, 6, 7, 8]].tolist()
    assert np.shares_memory(train, blocks)   # no copy of the corpus


def test_documents_are_read_one_at_a_time(tmp_path):
    """The stream takes documents as they are read; a list of them is never made."""
    for i in range(3):
        (tmp_path / f"{i}.txt").write_text("ab" * (i + 1))
    docs = corpus.iter_documents({"source": "files", "files": [str(tmp_path)]})
    assert not isinstance(docs, list)
    flat, n_docs, n_bytes = corpus.stream(docs)
    assert (bytes(flat), n_docs, n_bytes) == (b"ab\x00abab\x00ababab", 3, 12)
    assert flat.flags.writeable


# ---------------------------------------------------------------- a glob pattern, as data_files takes


def test_a_glob_pattern_names_the_files_and_they_are_in_the_cache_key(tmp_path, monkeypatch):
    s = tmp_path / "shards"
    jsonl(s / "train-0.jsonl", [{"text": "a0"}])
    jsonl(s / "train-1.jsonl", [{"text": "a1"}, {"text": "b1"}])
    jsonl(s / "other.jsonl", [{"text": "no"}])
    pattern = str(s / "train-*.jsonl")
    assert corpus.hub_kind(pattern) == "local"
    assert [x for _, x in corpus.hub_documents(pattern, "train", "text")] == [b"a0", b"a1", b"b1"]
    key = prepared_dir(hub_cfg(pattern), 1, tmp_path)
    jsonl(s / "other2.jsonl", [{"text": "no"}])          # a file the pattern does not match: same data
    assert prepared_dir(hub_cfg(pattern), 1, tmp_path) == key
    jsonl(s / "train-2.jsonl", [{"text": "c2"}])          # one it matches: new data
    assert prepared_dir(hub_cfg(pattern), 1, tmp_path) != key
    monkeypatch.chdir(tmp_path)                          # spelled relative: the same split
    assert corpus.split_seed(hub_cfg("shards/train-*.jsonl")) == corpus.split_seed(hub_cfg(pattern))
    with pytest.raises(ConfigError, match=r"^data.hub_name='shards/nope-\*.jsonl' matches no file$"):
        corpus.hub_kind("shards/nope-*.jsonl")
    (s / "train-3.csv").write_text("text\nx\n")
    with pytest.raises(ConfigError, match=r"^data.hub_name='shards/train-\*' matches train-0.jsonl, train-1.jsonl, "
                                          r"train-2.jsonl, train-3.csv: give a pattern of files of one of \.jsonl"):
        corpus.hub_documents("shards/train-*", "train", "text")


def test_preflight_takes_a_pattern(tmp_path, monkeypatch):
    monkeypatch.setenv("SCALELAB_CACHE", str(tmp_path / "cache"))
    for i in range(2):
        jsonl(tmp_path / "shards" / f"part-{i}.jsonl", [{"text": f"{i:02d}" + "x" * 62} for _ in range(20)])
    assert preflight(["data=hub", f"data.hub_name={tmp_path}/shards/part-*.jsonl", "data.global_batch_size=16",
                      "model=gpt_nano"]) == 1
    (prepared,) = (tmp_path / "cache" / "data").iterdir()
    assert read_meta(prepared)["documents"] == 40


def test_saving_blocks_does_not_pickle_them_for_a_fingerprint(tmp_path, monkeypatch):
    """Dataset() without a fingerprint pickled the whole table into memory to hash it (the peak of
    preparing: ~4 copies of the corpus); the blocks' own hash is given instead."""
    import datasets.arrow_dataset
    import numpy as np

    from scalelab.data.prepare import _save

    def refuse(*a, **k):
        raise AssertionError("generate_fingerprint called")

    monkeypatch.setattr(datasets.arrow_dataset, "generate_fingerprint", refuse)
    blocks = np.arange(12, dtype=np.uint8).reshape(4, 3)
    _save(blocks, 3, tmp_path / "b")
    assert [list(r) for r in datasets.load_from_disk(str(tmp_path / "b"))["input_ids"]] == blocks.tolist()
    state = json.loads((tmp_path / "b" / "state.json").read_text())
    _save(blocks.copy(), 3, tmp_path / "c")
    assert state["_fingerprint"] == json.loads((tmp_path / "c" / "state.json").read_text())["_fingerprint"]
    _save(blocks[::-1].copy(), 3, tmp_path / "d")
    assert state["_fingerprint"] != json.loads((tmp_path / "d" / "state.json").read_text())["_fingerprint"]


# ---------------------------------------------------------------- compressed files


def _compress(path, data: bytes, suffix: str):
    import bz2
    import gzip
    import lzma

    out = path.with_name(path.name + suffix)
    out.write_bytes({".gz": gzip.compress, ".bz2": bz2.compress, ".xz": lzma.compress}[suffix](data))
    return out


@pytest.mark.parametrize("suffix", [".gz", ".bz2", ".xz"])
def test_a_compressed_data_file_prepares_the_blocks_of_its_plain_copy(tmp_path, suffix):
    rows = [{"text": f"row {i}: " + "abc " * (i % 7)} for i in range(40)]
    plain = jsonl(tmp_path / "plain" / "notes.jsonl", rows)
    (tmp_path / "packed").mkdir()
    packed = _compress(tmp_path / "packed" / "notes.jsonl", open(plain, "rb").read(), suffix)
    a = prepare(hub_cfg(plain), 15, tmp_path / "cache", progress=False)
    b = prepare(hub_cfg(packed), 15, tmp_path / "cache", progress=False)
    assert read_meta(b)["documents"] == 40 and read_meta(b)["bytes"] == read_meta(a)["bytes"]
    assert sorted(blocks_of(b)) == sorted(blocks_of(a))   # (each path its own split seed: the same blocks)


def test_a_folder_of_compressed_csv_and_text_files(tmp_path):
    folder = tmp_path / "tables"
    folder.mkdir()
    _compress(folder / "train.csv", b"text,n\nhello there,1\ngeneral kenobi,2\n", ".gz")
    _compress(folder / "test.csv", b"text,n\nheld out,3\n", ".xz")
    assert tables.data_files(str(folder), "train") == ("csv", [folder / "train.csv.gz"])
    assert corpus.hub_documents(str(folder), "test", "text") == [(f"{folder}/0", b"held out")]
    texts = tmp_path / "texts"
    texts.mkdir()
    _compress(texts / "a.txt", b"alpha text\n", ".gz")
    _compress(texts / "b.txt", b"beta text\n", ".bz2")
    (texts / "c.txt.gz").write_bytes(b"not gzip at all")        # does not decompress: skipped, counted
    (texts / "d.txt").write_text("plain delta\n")
    info: dict = {}
    docs = text_files.file_documents([str(texts)], info)
    assert [(os.path.basename(n), d) for n, d in docs] == [("a.txt.gz", b"alpha text\n"), ("b.txt.bz2", b"beta text\n"),
                                                           ("d.txt", b"plain delta\n")]
    assert info["skipped_files"]["binary"] == 1
    with pytest.raises(ConfigError, match=r"data.files: '.*c.txt.gz' does not decompress as its name says \(.gz\)"):
        text_files.file_documents([str(texts / "c.txt.gz")])
    with pytest.raises(ConfigError, match=r"is a file but not one of .jsonl, .json, .csv, .parquet \(or "
                                          r".gz/.bz2/.xz of the first three"):
        tables.data_files(str(_compress(tmp_path / "t.parquet", b"x", ".gz")), "train")


def test_a_compressed_binary_in_a_text_folder_is_not_inflated_to_be_skipped(tmp_path):
    """Its first 8 KiB decompressed hold a NUL: skipped from those (a reviewer's 510 KB .gz of 512 MiB
    of zeros took 1 GB to be skipped)."""
    import gzip
    import tracemalloc

    (tmp_path / "docs").mkdir()
    (tmp_path / "docs" / "weights.bin.gz").write_bytes(gzip.compress(bytes(64 << 20), compresslevel=1))
    (tmp_path / "docs" / "notes.txt").write_text("some text\n")
    info: dict = {}
    tracemalloc.start()
    try:
        docs = text_files.file_documents([str(tmp_path / "docs")], info)
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert [os.path.basename(n) for n, _ in docs] == ["notes.txt"] and info["skipped_files"]["binary"] == 1
    assert peak < 8 << 20, peak   # bytes: the compressed file once (~64 KB) and its first block, not 64 MiB


def test_a_file_beside_its_compressed_copy_is_read_once(tmp_path):
    """Both would be read, every row twice (a reviewer's case, new with compressed files): a folder
    reads its plain data files alone where it has any (as before: a stray stats.csv.gz neither mixes
    formats nor adds rows), a text folder skips a file's compressed copy (counted as a duplicate),
    and a glob pattern, whose files are all read, is one line."""
    import gzip

    folder = tmp_path / "shards"
    jsonl(folder / "train.jsonl", [{"text": "ab"}])
    (folder / "train.jsonl.gz").write_bytes(gzip.compress((folder / "train.jsonl").read_bytes()))
    (folder / "stats.csv.gz").write_bytes(gzip.compress(b"n,m\n1,2\n"))
    assert tables.data_files(str(folder), "train") == ("json", [folder / "train.jsonl"])
    with pytest.raises(ConfigError, match=r"^data.hub_name='.*shards/train.\*': .*train.jsonl and .*train.jsonl.gz are "
                                          r"both in it \(a file and its compressed copy: every row read twice\): keep one"):
        tables.data_files(str(folder / "train.*"), "train")
    only = tmp_path / "packed"
    only.mkdir()
    (only / "train.jsonl.gz").write_bytes((folder / "train.jsonl.gz").read_bytes())
    assert tables.data_files(str(only), "train") == ("json", [only / "train.jsonl.gz"])
    texts = tmp_path / "texts"
    texts.mkdir()
    (texts / "notes.txt").write_text("hello\n")
    (texts / "notes.txt.bz2").write_bytes(__import__("bz2").compress(b"hello\n"))
    (texts / "other.txt.gz").write_bytes(gzip.compress(b"other text\n"))
    (texts / "x.tar").write_bytes(b"\x00binary")            # a binary file and its copy: skipped as ever
    (texts / "x.tar.gz").write_bytes(gzip.compress(b"\x00binary"))
    info: dict = {}
    docs = text_files.file_documents([str(texts)], info)
    assert [(os.path.basename(n), d) for n, d in docs] == [("notes.txt", b"hello\n"), ("other.txt.gz", b"other text\n")]
    assert info["skipped_files"] == {"empty": 0, "binary": 1, "duplicate": 2}
    # the folder and a copy in it named too, in either order: read once (review 2026-12-04: twice)
    for named in ([texts, texts / "notes.txt.bz2"], [texts / "notes.txt.bz2", texts]):
        docs = text_files.file_documents([str(p) for p in named])
        assert sorted(d for _, d in docs) == [b"hello\n", b"other text\n"], named


def test_local_data_files_temporary_copy_goes_under_the_jobs_cache_folder(tmp_path, monkeypatch):
    """Review 2026-12-04: with cache_dir=X the blocks went to X but the whole Arrow copy of the files to
    $SCALELAB_CACHE or ~/.cache/scalelab/tmp (a home quota on a cluster)."""
    monkeypatch.setenv("SCALELAB_CACHE", str(tmp_path / "elsewhere"))
    seen = []
    clear = tables.clear_stale
    monkeypatch.setattr(tables, "clear_stale", lambda folder, *a: seen.append(folder) or clear(folder, *a))
    f = jsonl(tmp_path / "x.jsonl", [{"text": "some text " * 30}] * 20)
    prepare(hub_cfg(f), 63, tmp_path / "mine")
    assert tmp_path / "mine" / "tmp" in seen and not (tmp_path / "elsewhere").exists(), seen


def test_run_data_says_what_the_run_trained_on(tmp_path, monkeypatch):
    """Review 2026-12-04: run.json had the config as typed (data.files=[notes.txt]: relative, no working
    folder): runs on two notes.txt of two folders read alike. run_data resolves the paths and copies
    the prepared data's counts: 3 documents of 100 bytes, 300 bytes, in 4 blocks of 64 + 1 bytes,
    1 of them val (round(4 x 0.25))."""
    from scalelab.data.prepare import run_data

    monkeypatch.chdir(tmp_path)
    (tmp_path / "d").mkdir()
    for i in range(3):
        (tmp_path / "d" / f"{i}.txt").write_text(chr(97 + i) * 100)
    cfg = {"source": "files", "files": ["d"], "val_fraction": 0.25}
    got = run_data(prepare(cfg, 64, tmp_path / "cache"), cfg)
    assert got["paths"] == [str(tmp_path / "d")] and got["prepared"].startswith(str(tmp_path / "cache"))
    assert {k: got[k] for k in ("documents", "bytes", "blocks", "train_blocks", "val_blocks", "block_bytes")} == {
        "documents": 3, "bytes": 300, "blocks": 4, "train_blocks": 3, "val_blocks": 1, "block_bytes": 65}
    assert got["fingerprint"].startswith("3 documents, 300 bytes (blocks ")

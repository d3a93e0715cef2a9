"""A user's own data, what a review found (2026-12-03): files a data=hub folder leaves out are
named on the data line; hub_split on a plain save_to_disk dataset is refused, not ignored; a data
folder's own state.json does not make it a save_to_disk folder; a cache hit says what it holds;
a killed prepare's temporary folder is removed by the next; data=text_files refuses a file named
with its compressed copy, and a glob pattern with a line that says where patterns go."""
from __future__ import annotations

import gzip
import os
import subprocess
import sys
import time
from pathlib import Path

import datasets
import pytest

from scalelab.data import corpus, tables, text_files
from scalelab.data.prepare import prepare, read_meta
from scalelab.errors import ConfigError

from .test_data_formats import hub_cfg, jsonl

ROWS = [{"body": f"row {i} " * 20} for i in range(40)]


def test_a_folder_s_files_left_out_are_on_the_data_line(tmp_path, capsys):
    d = tmp_path / "d"
    jsonl(d / "chat-2023.jsonl", ROWS)
    jsonl(d / "unit-test-logs.jsonl", ROWS)          # `datasets` names it the split 'test'
    jsonl(d / "dev_set_b.jsonl", ROWS)               # ... and this one 'validation'
    (d / "old.jsonl.gz").write_bytes(gzip.compress(b'{"body": "x"}\n'))   # passed over beside plain files
    # as datasets reads the folder: chat-2023.jsonl is in no split once other names say theirs (it was
    # read as 'train')
    with pytest.raises(ConfigError, match=r"^data.hub_split='train' is not in .*d: its data files make the split\(s\) "
                                          r"validation, test; chat-2023.jsonl in none \(as datasets reads a folder once "
                                          r"a file's name says a split: name it train-\*.jsonl to read it as train\)$"):
        prepare(hub_cfg(d, text_column="body"), 63, tmp_path / "cache")
    (d / "chat-2023.jsonl").rename(d / "train-2023.jsonl")
    out = prepare(hub_cfg(d, text_column="body"), 63, tmp_path / "cache")
    line = capsys.readouterr().out
    assert read_meta(out)["documents"] == 40                     # one file of 40 rows read
    assert "1 file(s) of the split test (data.hub_split=test reads it) not read" in line, line
    assert "1 file(s) of the split validation (data.hub_split=validation reads it) not read" in line
    assert "1 file(s) compressed, beside plain ones not read" in line
    # a hit says what the cache holds, once a process (it said nothing)
    prepare(hub_cfg(d, text_column="body"), 63, tmp_path / "cache")
    assert capsys.readouterr().out == ""                         # announced above
    from scalelab.data import prepare as prep

    prep._announced.clear()
    prepare(hub_cfg(d, text_column="body"), 63, tmp_path / "cache")
    again = capsys.readouterr().out
    assert again.startswith("[scalelab] data: 40 documents") and again.rstrip().endswith("(cached)"), again
    assert "of the split test" in again


def test_hub_split_on_one_saved_dataset_is_refused_not_ignored(tmp_path):
    saved = tmp_path / "saved"
    datasets.Dataset.from_dict({"text": ["ab", "cd"]}).save_to_disk(str(saved))
    assert [d for _, d in corpus.hub_documents(str(saved), "train", "text")] == [b"ab", b"cd"]
    with pytest.raises(ConfigError, match=r"data.hub_split='validation': .* is one dataset written by "
                                          r"Dataset.save_to_disk .*leave data.hub_split=train"):
        corpus.hub_documents(str(saved), "validation", "text")


def test_a_data_folder_with_its_own_state_json_is_read_as_data(tmp_path):
    d = tmp_path / "d"
    jsonl(d / "notes.jsonl", [{"text": "ab"}, {"text": "cd"}])
    (d / "state.json").write_text('{"step": 3}')             # a job's, not save_to_disk's
    assert not tables.is_saved_dataset(d)
    assert [doc for _, doc in corpus.hub_documents(str(d), "train", "text")] == [b"ab", b"cd"]


def test_an_empty_jsonl_file_says_it_has_no_rows(tmp_path):
    f = tmp_path / "empty.jsonl"
    f.write_text("")
    with pytest.raises(ConfigError, match=r"empty.jsonl'?: its json data could not be read \(StopIteration: no rows"):
        corpus.hub_documents(str(f), "train", "text")


def test_a_killed_prepare_s_temporary_folder_is_removed_by_the_next(tmp_path):
    cfg = hub_cfg(jsonl(tmp_path / "notes.jsonl", ROWS), text_column="body")
    data = tmp_path / "cache" / "data"
    # a process that is gone (its pid reaped) left one; another host's and a live process's stay
    dead = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True,
                          text=True).stdout.strip()
    host = os.uname().nodename
    gone, other_host, live = (data / f".tmp-{host}+{dead}+abc", data / f".tmp-elsewhere+{dead}+abc",
                              data / f".tmp-{host}+{os.getpid()}+abc")
    for d in (gone, other_host, live):
        (d / "train").mkdir(parents=True)
        os.utime(d, (time.time() - 2 * tables.STALE_AFTER_S,) * 2)   # an hour idle: no one writes there
    prepare(cfg, 63, tmp_path / "cache", progress=False)
    assert not gone.exists() and other_host.exists() and live.exists()
    assert not list(data.glob(f".tmp-{host}+{os.getpid()}+*[!c]"))   # its own was renamed into place


def test_text_files_named_with_their_compressed_copy_are_refused(tmp_path):
    (tmp_path / "a.txt").write_text("hello " * 50)
    (tmp_path / "a.txt.gz").write_bytes(gzip.compress(b"hello " * 50))
    with pytest.raises(ConfigError, match=r"data.files: .*a.txt and .*a.txt.gz are both in it"):
        text_files.file_documents([str(tmp_path / "a.txt"), str(tmp_path / "a.txt.gz")])


def test_a_pattern_in_data_files_says_where_patterns_go(tmp_path):
    (tmp_path / "a.txt").write_text("hello")
    with pytest.raises(ConfigError, match=r"data.files: '.*\*.txt' is a pattern: data=text_files reads files and "
                                          r"folders .*data=hub data.hub_name takes a pattern"):
        text_files.file_documents([str(tmp_path / "*.txt")])
    # as the command gives it: the config's existence check said "does not exist" first (review 2026-12-04)
    from scalelab.preflight import preflight

    with pytest.raises(ConfigError, match=r"^data.files: '.*\*.txt' is a pattern: data=text_files reads files"):
        preflight(["model=gpt_nano", "data=text_files", f"data.files=[{tmp_path}/*.txt]"], data=False)


def test_a_cut_saved_dataset_and_an_unreadable_text_file_are_one_line(tmp_path, monkeypatch):
    """Review 2026-12-04: a save_to_disk folder whose Arrow file was cut short, and a file of a text
    folder the user may not read, ended preflight with a traceback (exit 1)."""
    saved = tmp_path / "saved"
    datasets.Dataset.from_dict({"text": ["some text " * 50] * 200}).save_to_disk(str(saved))
    (arrow,) = saved.glob("*.arrow")
    os.truncate(arrow, arrow.stat().st_size // 2)
    with pytest.raises(ConfigError, match=r"^data.hub_name='.*saved': its dataset written by save_to_disk could not "
                                          r"be read \(\w+: .*\): is a file of it cut short or unreadable\?$") as e:
        list(corpus.hub_documents(str(saved), "train", "text"))
    assert "\n" not in str(e.value)
    folder = tmp_path / "notes"
    folder.mkdir()
    (folder / "a.txt").write_text("readable text")
    (folder / "b.txt").write_text("not for us")
    read = type(folder).read_bytes

    def denied(self):
        if self.name == "b.txt":   # as root no permission stops a read: the OS's error, raised
            raise PermissionError(13, "Permission denied", str(self))
        return read(self)

    monkeypatch.setattr(type(folder), "read_bytes", denied)
    with pytest.raises(ConfigError, match=r"^data.files: .*b.txt cannot be read \(Permission denied\): make it "
                                          r"readable, or move it out of the data$"):
        list(text_files.iter_file_documents([str(folder)]))
    # a compressed one too (it was counted as binary in a folder, and named "does not decompress")
    (folder / "b.txt").unlink()
    (folder / "c.txt.gz").write_bytes(gzip.compress(b"not for us either"))

    def opened(path, *args, **kwargs):
        if Path(path).name == "c.txt.gz":
            raise PermissionError(13, "Permission denied", str(path))
        return open(path, *args, **kwargs)

    monkeypatch.setattr(text_files, "open", opened, raising=False)
    for given in ([str(folder)], [str(folder / "c.txt.gz")]):
        with pytest.raises(ConfigError, match=r"^data.files: .*c.txt.gz cannot be read \(Permission denied\)"):
            list(text_files.iter_file_documents(given))

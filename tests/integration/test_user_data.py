"""Your own data, end to end through `scalelab-train` as a user runs it: one small text file
(the issue's case: it used to fail on every rank with IndexError, the val split being empty), a
large file with a folder of mixed files, a Hugging Face dataset saved to disk (offline), and a
corpus too small for one global batch (exit 2 before any rank starts). The split's properties
are unit tests on `prepare` (tests/unit/test_data_split.py)."""
from __future__ import annotations

import json
import math
import shutil
import time
from pathlib import Path

import pytest
import yaml

from scalelab.data.prepare import prepared_dir

from ..conftest import BASE, env, records, train, worker_pids
from ..unit.test_data_split import write_text

pytestmark = pytest.mark.integration


def _job(cwd: Path, args: list[str]) -> tuple[dict, dict]:
    """Run one job in cwd; returns its run record and its prepared data's meta.json. The prepared
    folder (in the shared test cache, keyed by these temporary files) is removed afterwards."""
    job = cwd / "job"
    train([*BASE, "logger=none", *args, f"hydra.run.dir={job}"], cwd)  # the default optimizer, as a user runs it
    rec = json.loads((job / "run.json").read_text())
    prepared = Path(yaml.safe_load((job / "config_resolved.yaml").read_text())["job"]["data_prepared"])
    meta = json.loads((prepared / "meta.json").read_text())
    shutil.rmtree(prepared, ignore_errors=True)
    return rec, meta


def test_one_small_file_trains_on_two_ddp_ranks_and_validates(tmp_path):
    """The issue's command (60 KB notes.txt, relative path, ddp at 2 ranks, gpt_nano), with
    validation every 5 of 10 steps."""
    write_text(tmp_path / "notes.txt", 60_000)
    rec, meta = _job(tmp_path, ["data=text_files", "data.files=[notes.txt]", "strategy=ddp", "trainer.devices=2",
                                "trainer.max_steps=10", "trainer.val_every_n_steps=5"])
    assert rec["status"] == "completed" and rec["steps"] == 10 and rec["world_size"] == 2
    assert (meta["blocks"], meta["train_blocks"], meta["val_blocks"]) == (923, 905, 18)
    # the record says which notes.txt (its path resolved) and what was prepared from it
    assert rec["data"]["paths"] == [str(tmp_path / "notes.txt")] and rec["config"]["data"]["files"] == ["notes.txt"]
    assert (rec["data"]["documents"], rec["data"]["blocks"], rec["data"]["val_blocks"]) == (1, 923, 18)
    val = rec["val"]
    assert val["every_n_steps"] == 5 and [s for s, _ in val["curve"]] == [5, 10]
    # the batches used, not only the cap (val_batches 8): 18 val blocks / 2 ranks = 9 per rank, micro-batch 8
    assert val["batches"] == 8 and val["micro_batches_per_rank"] == 2
    assert val["final"] == val["curve"][-1][1] and all(math.isfinite(v) for _, v in val["curve"])
    # the model learns the text: val loss falls, and sits near the training loss of the same step
    assert val["curve"][1][1] < val["curve"][0][1]
    train_loss = dict((int(s), v) for s, v in rec["loss"]["curve"])
    for s, v in val["curve"]:
        assert abs(v - train_loss[s]) < 1.0, (s, v, train_loss[s])


def test_large_file_and_a_folder_of_mixed_files(tmp_path):
    write_text(tmp_path / "big.txt", 3_000_000)
    docs = tmp_path / "docs"
    for i, (name, n) in enumerate({"a.txt": 40_000, "b.md": 3_000, "nested/c.txt": 20_000,
                                   "nested/deeper/d.txt": 500}.items()):
        write_text(docs / name, n, seed=i + 1)
    (docs / "empty.txt").write_bytes(b"")
    (docs / "nested" / "logo.png").write_bytes(b"\x89PNG\r\n\x1a\n\x00\x00\x00\rIHDR" + bytes(range(256)) * 8)
    rec, meta = _job(tmp_path, ["data=text_files", "data.files=[big.txt,docs/]", "strategy=single",
                                "trainer.devices=1", "trainer.max_steps=4"])
    assert rec["status"] == "completed" and rec["steps"] == 4
    assert meta["documents"] == 5 and meta["skipped_files"] == {"empty": 1, "binary": 1}
    assert meta["bytes"] == 3_063_500
    assert meta["val_blocks"] == round(meta["blocks"] * 0.02)
    assert meta["train_blocks"] + meta["val_blocks"] == meta["blocks"]
    assert rec["val"] is None  # validation is off by default


def test_hugging_face_dataset_saved_to_disk(tmp_path):
    import datasets

    rows = [write_text(tmp_path / f"s{i}.txt", 15_000, seed=i).read_text() for i in range(4)]
    datasets.DatasetDict({"train": datasets.Dataset.from_dict({"story": rows, "n": list(range(4))})}
                         ).save_to_disk(str(tmp_path / "my_dataset"))
    rec, meta = _job(tmp_path, ["data=hub", f"data.hub_name={tmp_path / 'my_dataset'}", "data.text_column=story",
                                "strategy=single", "trainer.devices=1", "trainer.max_steps=4"])
    assert rec["status"] == "completed" and rec["steps"] == 4
    assert meta["source"] == "hub" and meta["documents"] == 4 and meta["val_blocks"] >= 1


@pytest.mark.slow   # in-process: test_data_split.py::test_preflight_prepares_the_data_and_rejects_a_corpus_too_small
def test_corpus_too_small_for_one_global_batch_exits_2_before_any_rank(tmp_path, monkeypatch):
    write_text(tmp_path / "tiny.txt", 40 * 65)  # 40 blocks of 65 bytes: 39 train + 1 val
    t0 = time.time()
    proc = train(["data=text_files", "data.files=[tiny.txt]", "data.global_batch_size=64", "trainer.devices=2",
                  *BASE, "logger=none"], tmp_path, check=False)
    assert proc.returncode == 2, proc.stderr[-2000:]
    lines = [ln for ln in proc.stderr.splitlines() if ln.strip()]
    assert lines == ["error: data: the corpus yields 39 training blocks of 65 bytes, fewer than one global batch "
                     "of 64 (data.global_batch_size); give more text, or lower data.global_batch_size or "
                     "model.arch.seq_len"], lines
    assert not (tmp_path / "outputs").exists()  # no job started: no ranks.log, no run.json
    assert not list(tmp_path.rglob("ranks.log")) and not records(tmp_path)
    assert not worker_pids(tmp_path)
    assert time.time() - t0 < 60
    # preflight prepared the data (it must, to count the blocks); drop it from the shared cache
    monkeypatch.chdir(tmp_path)
    prepared = prepared_dir({"source": "files", "files": ["tiny.txt"], "val_fraction": 0.02, "max_documents": None},
                            64, Path(env()["SCALELAB_CACHE"]))
    assert json.loads((prepared / "meta.json").read_text())["train_blocks"] == 39
    shutil.rmtree(prepared)

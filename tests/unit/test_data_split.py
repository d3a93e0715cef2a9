"""Your own data: the train/val split by token block (prepare), its cache key, the size checks
preflight makes before any rank starts, and validation's wiring (timing, curve, loaders)."""
from __future__ import annotations

import json
import random
import time
from pathlib import Path
from types import SimpleNamespace

import datasets
import numpy as np
import pytest
import torch

from scalelab.data import corpus
from scalelab.data.datamodule import ShardSampler, ValidationCurve, validation_trainer_args
from scalelab.data.prepare import check_size, prepare, prepared_dir, read_meta
from scalelab.errors import ConfigError
from scalelab.preflight import preflight

T = 64  # gpt_nano's seq_len: blocks of 65 bytes
_WORDS = ("the of and to in a is that for it as was with be by on not he this are or his from at which but "
          "have an they you were her she all their one there we been has when who would more will so no if").split()


def write_text(path: Path, n_bytes: int, seed: int = 0) -> Path:
    """n_bytes of English-like text; every line is numbered, so no two 65-byte blocks are equal."""
    r = random.Random(seed)
    out, size, i = [], 0, 0
    while size < n_bytes:
        line = f"{i}: " + " ".join(r.choice(_WORDS) for _ in range(r.randint(6, 16))).capitalize() + ".\n"
        out.append(line)
        size += len(line)
        i += 1
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("".join(out)[:n_bytes])
    return path


def files_cfg(*paths, val_fraction=0.02) -> dict:
    return {"source": "files", "files": [str(p) for p in paths], "val_fraction": val_fraction, "max_documents": None}


def load(prepared: Path, split: str) -> np.ndarray:
    return np.asarray(datasets.load_from_disk(str(prepared / split))["input_ids"], dtype=np.uint8)


# ---------------------------------------------------------------- the split


@pytest.fixture(scope="module")
def small(tmp_path_factory):
    """One 60 KB file (the issue's case: one file used to leave the val split empty)."""
    d = tmp_path_factory.mktemp("small")
    f = write_text(d / "notes.txt", 60_000)
    return f, prepare(files_cfg(f), T, d / "cache", progress=False)


def test_one_small_file_gets_both_splits_at_the_stated_fraction(small):
    f, out = small
    meta = read_meta(out)
    assert meta["blocks"] == 60_000 // 65 == 923
    assert meta["val_blocks"] == round(923 * 0.02) == 18
    assert meta["train_blocks"] == 923 - 18
    train, val = load(out, "train"), load(out, "val")
    assert train.shape == (905, 65) and val.shape == (18, 65)


def test_no_block_is_in_both_splits_and_none_is_lost(small):
    f, out = small
    train, val = load(out, "train"), load(out, "val")
    every = corpus._blocks([("x", f.read_bytes())], 65)
    rows = lambda a: {r.tobytes() for r in a}  # noqa: E731
    assert len(rows(every)) == len(every)  # numbered lines: all blocks distinct
    assert not rows(train) & rows(val)
    assert rows(train) | rows(val) == rows(every)


def test_split_is_deterministic_and_independent_of_run_and_cache(small, tmp_path):
    f, out = small
    again = prepare(files_cfg(f), T, tmp_path / "other_cache", progress=False)
    assert np.array_equal(load(out, "val"), load(again, "val"))
    assert np.array_equal(load(out, "train"), load(again, "train"))
    # Seeded by the data config: the same data always gives the same seed; other data another one.
    assert corpus.split_seed(files_cfg(f)) == corpus.split_seed(files_cfg(f))
    assert corpus.split_seed(files_cfg(f)) != corpus.split_seed(files_cfg(f, tmp_path))
    # and spread over the corpus, not one end of it
    idx = corpus.split_blocks(923, 0.02, corpus.split_seed(files_cfg(f)), 65)
    assert idx.min() < 923 // 3 and idx.max() > 2 * 923 // 3


@pytest.mark.parametrize("n", [2, 3, 10, 49, 50, 51, 1000, 123_457])
@pytest.mark.parametrize("frac", [0.001, 0.02, 0.1, 0.5, 0.9])
def test_split_blocks_fraction_within_rounding_never_empty(n, frac):
    expected = max(1, int(np.floor(n * frac + 0.5)))  # round half up, at least 1
    if n - expected < 1:  # no train block would be left: an error, never an empty split
        with pytest.raises(ConfigError, match=r"too few for a train and a val split"):
            corpus.split_blocks(n, frac, seed=42, block_bytes=65)
        return
    idx = corpus.split_blocks(n, frac, seed=42, block_bytes=65)
    n_val = len(idx)
    assert n_val == expected and n - n_val >= 1
    assert abs(n_val - n * frac) <= 0.5 or n_val == 1  # the stated fraction, within rounding
    assert len(set(idx.tolist())) == n_val and idx.min() >= 0 and idx.max() < n
    assert np.array_equal(idx, corpus.split_blocks(n, frac, seed=42, block_bytes=65))


def test_a_larger_fraction_holds_out_a_superset():
    small_ = set(corpus.split_blocks(1000, 0.02, 7, 65).tolist())
    large = set(corpus.split_blocks(1000, 0.1, 7, 65).tolist())
    assert small_ < large


@pytest.mark.parametrize("n,frac,expected", [
    (0, 0.02, r"the corpus yields no block of 65 bytes"),
    (1, 0.02, r"yields 1 block\(s\) of 65 bytes, too few for a train and a val split"),
    (1, 0.5, r"too few for a train and a val split"),
    (10, 1.0, r"data.val_fraction=1.0 must be a number in \[0, 1\)"),
    (10, -0.1, r"data.val_fraction=-0.1 must be"),
])
def test_empty_split_is_a_clear_error(n, frac, expected):
    with pytest.raises(ConfigError, match=expected):
        corpus.split_blocks(n, frac, 1, 65)


def test_val_fraction_zero_has_no_val_split(tmp_path):
    f = write_text(tmp_path / "a.txt", 10_000)
    out = prepare(files_cfg(f, val_fraction=0.0), T, tmp_path / "cache", progress=False)
    meta = read_meta(out)
    assert (meta["val_blocks"], meta["train_blocks"]) == (0, 10_000 // 65)
    assert not (out / "val").exists()  # an empty Arrow dataset does not load back


def test_a_two_block_corpus_still_gets_both_splits(tmp_path):
    f = write_text(tmp_path / "tiny.txt", 2 * 65 + 10)
    meta = read_meta(prepare(files_cfg(f), T, tmp_path / "cache", progress=False))
    assert (meta["train_blocks"], meta["val_blocks"]) == (1, 1)


def test_mixed_folder_reads_text_recursively_and_skips_binary_empty_hidden(tmp_path):
    root = tmp_path / "docs"
    sizes = {"a.txt": 30_000, "b.md": 5_000, "sub/c.txt": 12_000, "sub/deeper/d.rst": 800}
    for i, (name, n) in enumerate(sizes.items()):
        write_text(root / name, n, seed=i)
    (root / "empty.txt").write_bytes(b"")
    (root / "sub" / "image.png").write_bytes(b"\x89PNG\r\n\x1a\n\x00\x00\x00\rIHDR" + bytes(range(256)) * 4)
    (root / ".git").mkdir()
    write_text(root / ".git" / "config", 4_000)
    notes = write_text(tmp_path / "notes.txt", 7_000, seed=9)
    out = prepare(files_cfg(notes, root), T, tmp_path / "cache", progress=False)
    meta = read_meta(out)
    assert meta["documents"] == meta["files"] == 5  # notes + 4 text files, nested ones included
    assert meta["skipped_files"] == {"empty": 1, "binary": 1, "hidden": 1}   # .git/config
    total = 7_000 + sum(sizes.values())
    assert meta["bytes"] == total
    assert meta["blocks"] == (total + 4) // 65  # + the 0-byte separators between the 5 documents
    assert meta["val_blocks"] == round(meta["blocks"] * 0.02) >= 1
    assert not (load(out, "train") > 127).any()  # no binary bytes got in


def test_folder_without_text_is_an_error(tmp_path):
    (tmp_path / "d").mkdir()
    (tmp_path / "d" / "e.txt").write_bytes(b"")
    with pytest.raises(ConfigError, match=r"data.files: no text found .*skipped 1 empty"):
        prepare(files_cfg(tmp_path / "d"), T, tmp_path / "cache", progress=False)


def test_a_named_empty_or_binary_file_is_one_line(tmp_path):
    """A file named in data.files is read as given; an empty one said 'no text found ... (skipped 0
    empty ...)', and a binary one was trained on as bytes."""
    (tmp_path / "e.txt").write_bytes(b"")
    (tmp_path / "b.bin").write_bytes(b"ELF\x00\x01" + b"x" * 100)
    with pytest.raises(ConfigError, match=rf"^data.files: '{tmp_path / 'e.txt'}' is empty"):
        prepare(files_cfg(tmp_path / "e.txt"), T, tmp_path / "cache", progress=False)
    with pytest.raises(ConfigError, match=rf"^data.files: '{tmp_path / 'b.bin'}' is not text \(a NUL byte"):
        prepare(files_cfg(tmp_path / "b.bin"), T, tmp_path / "cache", progress=False)


def test_large_file(tmp_path):
    f = write_text(tmp_path / "big.txt", 3_000_000)
    t0 = time.perf_counter()
    out = prepare(files_cfg(f), T, tmp_path / "cache", progress=False)
    took = time.perf_counter() - t0
    meta = read_meta(out)
    assert meta["blocks"] == 3_000_000 // 65 == 46_153
    assert meta["val_blocks"] == 923 and meta["train_blocks"] == 46_153 - 923
    assert took < 30, took  # measured ~0.3 s


# ---------------------------------------------------------------- hub: a dataset saved to disk


def test_hub_dataset_saved_to_disk_loads_offline(tmp_path):
    rows = [write_text(tmp_path / f"t{i}.txt", 20_000, seed=i).read_text() for i in range(3)]
    datasets.Dataset.from_dict({"story": rows, "id": [1, 2, 3]}).save_to_disk(str(tmp_path / "ds"))
    datasets.DatasetDict({"train": datasets.Dataset.from_dict({"story": rows[:2]}),
                          "validation": datasets.Dataset.from_dict({"story": rows[2:]})}
                         ).save_to_disk(str(tmp_path / "dd"))
    cfg = {"source": "hub", "hub_name": str(tmp_path / "ds"), "hub_split": "train", "text_column": "story",
           "val_fraction": 0.02, "max_documents": None}
    meta = read_meta(prepare(cfg, T, tmp_path / "cache", progress=False))
    assert meta["documents"] == 3 and meta["blocks"] == (60_000 + 2) // 65 and meta["val_blocks"] == 18
    meta = read_meta(prepare({**cfg, "hub_name": str(tmp_path / "dd")}, T, tmp_path / "cache", progress=False))
    assert meta["documents"] == 2
    with pytest.raises(ConfigError, match=r"data.hub_split='test' is not in .*train, validation"):
        prepare({**cfg, "hub_name": str(tmp_path / "dd"), "hub_split": "test"}, T, tmp_path / "c2", progress=False)
    with pytest.raises(ConfigError, match=r"data.text_column='text' not in .*story"):
        prepare({**cfg, "text_column": "text"}, T, tmp_path / "c3", progress=False)
    with pytest.raises(ConfigError, match=r"is a folder but not a dataset written by save_to_disk"):
        prepare({**cfg, "hub_name": str(tmp_path)}, T, tmp_path / "c4", progress=False)


@pytest.mark.parametrize("name,kind", [("roneneldan/TinyStories", "hub"), ("wikitext", "hub"),
                                       ("/no/such/folder", None), ("./rel/missing", None), ("a/b/c", None),
                                       ("~/nope-scalelab", None)])
def test_hub_name_is_a_folder_or_a_plausible_hub_id(name, kind):
    if kind is None:
        with pytest.raises(ConfigError, match=r"neither an existing folder .* nor a hub dataset name"):
            corpus.hub_kind(name)
    else:
        assert corpus.hub_kind(name) == kind


# ---------------------------------------------------------------- the cache


def test_cache_key_changes_with_version_and_content_and_is_reused_otherwise(tmp_path):
    f = write_text(tmp_path / "notes.txt", 5_000)
    cfg = files_cfg(f)
    d1 = prepared_dir(cfg, T, tmp_path)
    assert f"-v{corpus.PREP_VERSION}-" in d1.name and corpus.PREP_VERSION >= 2
    out = prepare(cfg, T, tmp_path, progress=False)
    assert out == d1 and prepare(cfg, T, tmp_path, progress=False) == d1  # a hit
    write_text(f, 6_000)  # new content
    assert prepared_dir(cfg, T, tmp_path) != d1
    assert prepared_dir({**cfg, "val_fraction": 0.05}, T, tmp_path) != prepared_dir(cfg, T, tmp_path)
    nested = write_text(tmp_path / "dir" / "sub" / "x.txt", 3_000)
    before = prepared_dir(files_cfg(tmp_path / "dir"), T, tmp_path)
    write_text(nested, 3_500)  # a nested file's change reaches the folder's key
    assert prepared_dir(files_cfg(tmp_path / "dir"), T, tmp_path) != before
    assert not list((tmp_path / "data").glob(".tmp-*"))  # write-then-rename left no temp folder


def test_the_stdlib_corpus_key_names_the_python_it_came_from(monkeypatch, tmp_path):
    """Two virtualenvs of two Pythons sharing ~/.cache/scalelab must not share the stdlib corpus."""
    before = prepared_dir({"source": "stdlib"}, T, tmp_path)
    monkeypatch.setattr(corpus.platform, "python_version", lambda: "3.99.0")
    assert prepared_dir({"source": "stdlib"}, T, tmp_path) != before


def test_a_prepared_folder_is_as_readable_as_the_umask_says(tmp_path):
    """mkdtemp's 0700 survived the rename: a team cache was its first user's only."""
    import os

    old = os.umask(0o002)
    try:
        out = prepare(files_cfg(write_text(tmp_path / "n.txt", 5_000)), T, tmp_path, progress=False)
    finally:
        os.umask(old)
    assert out.stat().st_mode & 0o777 == 0o775


def test_a_finished_cache_written_meanwhile_is_kept(tmp_path, monkeypatch):
    """Write-then-rename: if another job renamed its folder first, ours is dropped, theirs kept."""
    import scalelab.data.prepare as prep

    f = write_text(tmp_path / "n.txt", 5_000)
    cfg = files_cfg(f)
    out = prepared_dir(cfg, T, tmp_path)
    real_save = prep._save

    def racing_save(blocks, block, path):
        real_save(blocks, block, path)
        if path.name == "train" and not out.exists():  # the other job finishes while we write
            out.mkdir(parents=True)
            (out / "meta.json").write_text(json.dumps({"theirs": True}))

    monkeypatch.setattr(prep, "_save", racing_save)
    assert prepare(cfg, T, tmp_path, progress=False) == out
    assert read_meta(out) == {"theirs": True}
    assert not list((tmp_path / "data").glob(".tmp-*"))


# ---------------------------------------------------------------- preflight: before any rank


def test_check_size_names_the_sizes():
    meta = {"block_bytes": 65, "train_blocks": 37, "val_blocks": 1}
    with pytest.raises(ConfigError, match=r"^data: the corpus yields 37 training blocks of 65 bytes, fewer than one "
                                          r"global batch of 64 \(data.global_batch_size\); give more text, or lower "
                                          r"data.global_batch_size or model.arch.seq_len$"):
        check_size(meta, 64, 2, validation=False)
    check_size(meta, 32, 2, validation=False)
    with pytest.raises(ConfigError, match=r"val split has 1 block\(s\) .* fewer than one per data-parallel rank \(2\)"):
        check_size(meta, 32, 2, validation=True)


@pytest.fixture
def cache(tmp_path, monkeypatch):
    monkeypatch.setenv("SCALELAB_CACHE", str(tmp_path / "cache"))
    return tmp_path / "cache"


def test_preflight_prepares_the_data_and_rejects_a_corpus_too_small(tmp_path, cache):
    f = write_text(tmp_path / "tiny.txt", 40 * 65)  # 40 blocks: 39 train + 1 val
    with pytest.raises(ConfigError, match=r"the corpus yields 39 training blocks of 65 bytes, fewer than one "
                                          r"global batch of 64") as e:
        preflight(["data=text_files", f"data.files=[{f}]", "data.global_batch_size=64", "model=gpt_nano"])
    assert "\n" not in str(e.value)
    assert preflight(["data=text_files", f"data.files=[{f}]", "data.global_batch_size=32", "model=gpt_nano"]) == 1
    assert len(list((cache / "data").iterdir())) == 1  # prepared once, found by the job


@pytest.mark.parametrize("args,expected", [
    (["data.val_fraction=1"], r"data.val_fraction=1 must be a number in \[0, 1\)"),
    (["data.val_fraction=abc"], r"data.val_fraction='abc' must be a number"),
    (["data=hub", "data.hub_name=/no/such/saved_dataset"], r"data.hub_name='/no/such/saved_dataset' is neither"),
    (["strategy=pipeline", "trainer.devices=2", "trainer.val_every_n_steps=5"],
     r"trainer.val_every_n_steps=5 does not work with strategy=pipeline: its schedule runs forward and backward"),
    (["trainer.val_every_n_steps=0"], r"trainer.val_every_n_steps=0 must be an integer >= 1"),
    (["trainer.val_every_n_steps=5", "trainer.val_batches=0"], r"trainer.val_batches=0 must be an integer >= 1"),
    (["trainer.val_every_n_steps=5", "data.val_fraction=0"], r"needs a val split: data.val_fraction is 0"),
])
def test_preflight_rejects_bad_data_and_validation_settings(args, expected, cache):
    with pytest.raises(ConfigError, match=expected) as e:
        preflight(["model=gpt_nano", *args])
    assert "\n" not in str(e.value)
    assert not cache.exists()  # rejected before any data was prepared


def test_pass_through_flags_prepare_nothing(tmp_path, cache):
    f = write_text(tmp_path / "n.txt", 5_000)
    assert preflight(["--cfg", "job", "data=text_files", f"data.files=[{f}]"]) == 0
    assert not cache.exists()


# ---------------------------------------------------------------- validation wiring


def test_validation_trainer_args_count_optimizer_steps_and_global_batches():
    off = validation_trainer_args({"val_every_n_steps": None, "val_batches": 8}, 4)
    assert off == {"limit_val_batches": 0}
    on = validation_trainer_args({"val_every_n_steps": 5, "val_batches": 8}, 4)
    assert on == {"val_check_interval": 20, "check_val_every_n_epoch": None, "limit_val_batches": 32}


def test_val_shards_give_every_rank_the_same_count_and_no_overlap():
    shards = [list(ShardSampler(19, r, 4)) for r in range(4)]
    assert [len(s) for s in shards] == [4, 4, 4, 4]
    assert sorted(i for s in shards for i in s) == list(range(16))
    assert list(ShardSampler(3, 0, 1)) == [0, 1, 2]


class _Plan:
    def state_bytes(self, trainer, pl_module):
        return {}

    def grad_bytes(self, trainer, pl_module):
        return 0


def test_step_times_exclude_validation_in_a_real_fit(tmp_path):
    """Lightning runs validation after one step's on_train_batch_end and before the next step: a
    slow validation (0.3 s) must show in no step's time (StepMetrics.on_validation_end)."""
    import lightning as L
    from torch.utils.data import DataLoader, TensorDataset

    from scalelab.scaling.metrics import StepMetrics

    class Tiny(L.LightningModule):
        def __init__(self):
            super().__init__()
            self.lin = torch.nn.Linear(4, 1)

        def training_step(self, batch, i):
            loss = self.lin(batch[0]).pow(2).mean()
            return {"loss": loss, "raw_loss": loss.detach()}

        def validation_step(self, batch, i):
            time.sleep(0.3)
            self.log("val/loss", self.lin(batch[0]).pow(2).mean())

        def configure_optimizers(self):
            return torch.optim.SGD(self.parameters(), lr=0.01)

    data = DataLoader(TensorDataset(torch.randn(64, 4)), batch_size=4)
    metrics = StepMetrics(accumulate=1, plan=_Plan())
    curve = ValidationCurve(every_n_steps=2, batches=1)
    trainer = L.Trainer(accelerator="cpu", devices=1, max_steps=6, logger=False, enable_checkpointing=False,
                        enable_progress_bar=False, enable_model_summary=False, num_sanity_val_steps=0,
                        default_root_dir=str(tmp_path),
                        **validation_trainer_args({"val_every_n_steps": 2, "val_batches": 1}, 1),
                        callbacks=[metrics, curve])
    trainer.fit(Tiny(), train_dataloaders=data, val_dataloaders=data)
    assert [s for s, _ in curve.curve] == [2, 4, 6]
    assert len(metrics.step_times) == 6
    assert max(metrics.step_times[1:]) < 0.2, metrics.step_times  # steps 3 and 5 follow a 0.3 s validation
    rec = curve.record()
    assert rec["every_n_steps"] == 2 and rec["final"] == rec["curve"][-1][1] and rec["final_step"] == 6


def test_step_metrics_timer_restarts_when_validation_ends():
    from scalelab.scaling.metrics import StepMetrics

    m = StepMetrics(accumulate=1, plan=_Plan())
    mod = SimpleNamespace(device=torch.device("meta"))  # not cpu: no host-speed probe
    trainer = SimpleNamespace(global_step=1)
    m.on_train_start(trainer, mod)
    m.on_train_batch_end(trainer, mod, {"raw_loss": torch.tensor(1.0)}, None, 0)
    time.sleep(0.25)  # validation
    m.on_validation_end(trainer, mod)
    m.on_train_batch_end(trainer, mod, {"raw_loss": torch.tensor(1.0)}, None, 1)
    assert m.step_times[1] < 0.1, m.step_times


@pytest.mark.parametrize("pin", [False, True])
def test_gpu_ranks_get_pinned_batches(small, pin):
    """pin_memory (the worker sets it for accelerator == gpu, datamodule.py says why: a pageable
    host-to-device batch copy drains the device queue every step) reaches both DataLoaders."""
    import warnings

    from scalelab.data.datamodule import ByteCorpusDataModule

    dm = ByteCorpusDataModule(small[1], global_batch=4, micro_batch=2, dp_rank=0, dp_size=2, seed=0, pin_memory=pin)
    dm.setup()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # torch warns that pinning is a no-op without an accelerator
        assert dm.train_dataloader().pin_memory is pin
        assert dm.val_dataloader().pin_memory is pin


def test_pin_memory_setting():
    from scalelab.worker import pins_batches

    assert pins_batches("auto", "gpu") is True and pins_batches("auto", "cpu") is False
    assert pins_batches(False, "gpu") is False and pins_batches(True, "cpu") is True


def test_unreachable_hub_is_one_error_line_with_the_offline_way(monkeypatch, capfd, caplog):
    """Offline, huggingface_hub logged 11 retry lines over ~23 s before the error (walkthrough);
    now one progress line, the retries silenced, and an error naming what loads offline."""
    import socket

    import datasets

    from scalelab.data import corpus

    for proxy in corpus.PROXY_VARS:
        monkeypatch.delenv(proxy, raising=False)
    with socket.socket() as s:               # a port nobody listens on: connection refused
        s.bind(("127.0.0.1", 0))
        closed = s.getsockname()[1]
    monkeypatch.setenv("HF_ENDPOINT", f"http://127.0.0.1:{closed}")
    assert corpus._hub_reachable(timeout_s=1.0) is False
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        s.listen()
        monkeypatch.setenv("HF_ENDPOINT", f"http://127.0.0.1:{s.getsockname()[1]}")
        assert corpus._hub_reachable(timeout_s=1.0) is True
    monkeypatch.setenv("HF_ENDPOINT", f"http://127.0.0.1:{closed}")
    monkeypatch.setenv("HTTPS_PROXY", "http://proxy.example:3128")     # behind a proxy: cannot tell
    assert corpus._hub_reachable(timeout_s=1.0) is True
    monkeypatch.delenv("HTTPS_PROXY")
    for odd in ("hub.example.org", "http://127.0.0.1:99999"):          # no scheme; a port out of range
        monkeypatch.setenv("HF_ENDPOINT", odd)
        assert corpus._hub_reachable(timeout_s=1.0) is True
    monkeypatch.setenv("HF_ENDPOINT", f"http://127.0.0.1:{closed}")

    def offline(name, split):
        import logging
        logging.getLogger("huggingface_hub.utils._http").warning("Retrying in 1s [Retry 1/5].")
        raise ConnectionError(f"Couldn't reach '{name}' on the Hub (LocalEntryNotFoundError)")

    monkeypatch.setattr(datasets, "load_dataset", offline)
    with pytest.raises(ConfigError, match=r"Couldn't reach .* save_to_disk loads offline") as e:
        corpus.hub_documents("owner/name", "train", "text")
    assert "\n" not in str(e.value)
    err = capfd.readouterr().err
    assert err.count("\n") == 1 and "owner/name from the Hugging Face Hub" in err
    assert not [r for r in caplog.records if "Retrying" in r.getMessage()]   # the retries: not logged


def test_a_split_is_read_in_place_from_its_memory_map(tmp_path):
    """BlockDataset keeps one zero-copy view of the map per Arrow chunk: every block's bytes lie
    inside the memory-mapped files (combine_chunks() copied the whole split into each rank's
    memory: 800 GB per 8-rank node for a 100 GB corpus), and blocks read back as written."""
    from scalelab.data.datamodule import BlockDataset
    from scalelab.data.prepare import _save

    rng = np.random.default_rng(0)
    blocks = rng.integers(0, 256, size=(2500, 17), dtype=np.uint8)   # save_to_disk: 1000-row batches
    _save(blocks, 17, tmp_path / "split")
    ds = BlockDataset(tmp_path / "split")
    assert len(ds._parts) >= 3 and len(ds) == 2500
    for m in ds._maps:
        m.seek(0)
    maps = [m.read_buffer() for m in ds._maps]   # the whole map, zero-copy: its address range
    inside = [(b.address, b.address + b.size) for b in maps]
    for part in ds._parts:
        addr = part.__array_interface__["data"][0]
        assert any(lo <= addr and addr + part.nbytes <= hi for lo, hi in inside), "a copy, not the map"
    for i in (0, 999, 1000, 1001, 2499):
        assert np.array_equal(ds[i].numpy(), blocks[i])
    with pytest.raises(IndexError):
        ds[2500]


def test_loader_workers_of_a_forkserver_rank_read_the_blocks(tmp_path):
    """launcher=local's ranks are forkserver children, and a DataLoader's workers there get the
    dataset pickled: the open memory maps could not be (every run with data.num_workers >= 1 failed;
    its error read Lightning's teardown "Please call iter(combined_loader) first"). The workers'
    batches are the blocks as written, in the sampler's order."""
    import pickle

    from torch.utils.data import DataLoader

    from scalelab.data.datamodule import BlockDataset, _collate
    from scalelab.data.prepare import _save

    blocks = np.arange(40 * 9, dtype=np.uint8).reshape(40, 9)
    _save(blocks, 9, tmp_path / "split")
    ds = BlockDataset(tmp_path / "split")
    again = pickle.loads(pickle.dumps(ds))
    assert len(again) == 40 and np.array_equal(again[39].numpy(), blocks[39])
    loader = DataLoader(ds, batch_size=4, sampler=[3, 1, 4, 15, 9, 2, 6, 5], num_workers=1, collate_fn=_collate,
                        multiprocessing_context="forkserver")
    got = [b.numpy() for b in loader]
    assert [g.tolist() for g in got] == [blocks[[3, 1, 4, 15]].tolist(), blocks[[9, 2, 6, 5]].tolist()]


def test_an_unreachable_hub_loads_in_offline_mode(monkeypatch):
    """The reachability probe runs first: offline, load_dataset retried ~25 s before its error
    (data=hub took 27-31 s to refuse); in Hugging Face's offline mode it reads the cache or fails
    at once. The mode is set only around the call, and only where the Hub cannot be reached."""
    import datasets
    from huggingface_hub import constants

    from scalelab.data import corpus

    seen = []

    def load(name, split):
        seen.append((datasets.config.HF_HUB_OFFLINE, constants.HF_HUB_OFFLINE))
        raise ConnectionError(f"Couldn't reach '{name}' on the Hub (OfflineModeIsEnabled)")

    before = (datasets.config.HF_HUB_OFFLINE, constants.HF_HUB_OFFLINE)
    assert before == (False, False)
    monkeypatch.setattr(datasets, "load_dataset", load)
    for reachable in (False, True):
        monkeypatch.setattr(corpus, "_hub_reachable", lambda timeout_s=3.0, r=reachable: r)
        with pytest.raises(ConfigError) as e:
            corpus.hub_documents("owner/name", "train", "text")
        assert ("not in the Hugging Face cache" in str(e.value)) is not reachable
    assert seen == [(True, True), (False, False)]
    assert (datasets.config.HF_HUB_OFFLINE, constants.HF_HUB_OFFLINE) == before

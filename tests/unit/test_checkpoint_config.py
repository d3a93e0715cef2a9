"""checkpoint_config reads the config and step a checkpoint carries from its pickle's index alone:
no tensor is read and nothing the file names is run (tests/integration/test_resume_review.py: a real
run's copied checkpoint refused for another model)."""
from __future__ import annotations

import os
import pickle
import zipfile
from collections import OrderedDict

import torch

from scalelab.checkpoint_config import KEY, saved_config, saved_entries, saved_step
from scalelab.checkpointing import checkpoint_step, saved_by

CONFIG = {"strategy": {"name": "ddp", "_target_": "scalelab.strategies.ddp.DDP"},
          "model": {"arch": {"n_layers": 2, "d_model": 64, "dropout": 0.1}}, "seed": 3, "tags": ["a", None, 1.5]}


def _lightning_like(path, **extra):
    torch.save({"epoch": 0, "global_step": 40, "state_dict": OrderedDict(w=torch.ones(3, 4)),
                "optimizer_states": [{"state": {0: {"momentum_buffer": torch.zeros(3)}}}],
                "hparams": torch.nn.Linear(2, 2), **extra}, path)   # a class to stand in for Lightning's own


def test_a_file_checkpoint_gives_its_config_and_step_without_its_tensors(tmp_path):
    ckpt = tmp_path / "colleague.ckpt"   # a copy: no manifest, no step in its name, no job folder
    _lightning_like(ckpt, **{KEY: CONFIG})
    assert saved_config(ckpt) == CONFIG and saved_by(ckpt) == CONFIG
    assert saved_step(ckpt) == 40 and checkpoint_step(ckpt) == 40
    entries = saved_entries(ckpt)
    assert entries["epoch"] == 0 and isinstance(entries["state_dict"], OrderedDict)
    assert not isinstance(entries["state_dict"]["w"], torch.Tensor)   # a placeholder: never read


def test_a_checkpoint_without_one_gives_none(tmp_path):
    ckpt = tmp_path / "old.ckpt"
    _lightning_like(ckpt)
    assert saved_config(ckpt) is None and saved_by(ckpt) is None
    (tmp_path / "notes.txt").write_text("not a checkpoint")
    assert saved_entries(tmp_path / "notes.txt") is None and saved_entries(tmp_path / "missing.ckpt") is None


def test_sharded_folders_carry_it_in_their_meta_or_deepspeeds_model_states(tmp_path):
    dcp = tmp_path / "dcp.ckpt"
    dcp.mkdir()
    torch.save({"global_step": 7, KEY: CONFIG}, dcp / "meta.pt")
    assert saved_config(dcp) == CONFIG and saved_step(dcp) == 7
    ds = tmp_path / "ds.ckpt"
    (ds / "checkpoint").mkdir(parents=True)
    (ds / "latest").write_text("checkpoint")
    torch.save({"module": OrderedDict(w=torch.ones(2)), "global_step": 9, KEY: CONFIG},
               ds / "checkpoint" / "mp_rank_00_model_states.pt")
    assert saved_config(ds) == CONFIG and saved_step(ds) == 9
    z3 = ds / "checkpoint" / "zero_pp_rank_0_mp_rank_00_model_states.pt"   # ZeRO-3: one per rank
    (ds / "checkpoint" / "mp_rank_00_model_states.pt").rename(z3)
    assert saved_config(ds) == CONFIG and saved_step(ds) == 9
    for tag in ("../elsewhere", "..", "."):   # a tag that leaves the folder is not followed
        (ds / "latest").write_text(tag)
        assert saved_config(ds) is None


class _RunsACommand:
    def __reduce__(self):
        return (os.system, (f"touch {self.mark}",))


def test_nothing_the_file_names_is_run(tmp_path):
    mark = tmp_path / "ran"
    payload = _RunsACommand()
    payload.mark = mark
    ckpt = tmp_path / "hostile.ckpt"
    with zipfile.ZipFile(ckpt, "w") as z:
        z.writestr("archive/data.pkl", pickle.dumps({KEY: CONFIG, "x": payload}, protocol=2))
    assert saved_config(ckpt) == CONFIG
    assert not mark.exists()
    pickle.loads(pickle.dumps(payload))   # the same pickle, loaded by pickle itself, does run it
    assert mark.exists()


def _data_pkl(path, payload: bytes, compress=zipfile.ZIP_STORED):
    with zipfile.ZipFile(path, "w", compression=compress) as z:
        z.writestr("archive/data.pkl", payload)
    return path


def test_a_pickle_that_asks_for_memory_gets_none_of_it(tmp_path):
    """Nested codecs.encode(x, "hex_codec") doubles the bytes each time (a 365-byte pickle asking for
    32 GiB at depth 34, a reviewer's case); a deflated member claims sizes it does not hold."""
    import tracemalloc

    value = b"C\x01a"
    for _ in range(34):   # encode(encode(...(b"a", "hex_codec")...), "hex_codec"): 16 GiB by pickle.loads
        value = b"h\x02(" + value + b"X\t\x00\x00\x00hex_codectR"
    grow = (b"\x80\x02c_codecs\nencode\nq\x020}q\x00(X\x0f\x00\x00\x00scalelab_configq\x01}X\x04\x00\x00\x00seedK"
            b"\x03sX\x01\x00\x00\x00x" + value + b"su.")
    assert len(grow) < 1000
    ckpt = _data_pkl(tmp_path / "grow.ckpt", grow)
    tracemalloc.start()
    try:
        assert saved_config(ckpt) is None   # no plain tree: a placeholder in it
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert peak < 4 << 20, peak   # nothing grew (bytes)
    deflated = pickle.dumps({KEY: CONFIG}, protocol=2)
    assert saved_config(_data_pkl(tmp_path / "deflated.ckpt", deflated, zipfile.ZIP_DEFLATED)) is None
    assert saved_config(_data_pkl(tmp_path / "stored.ckpt", deflated)) == CONFIG


def test_a_config_that_is_no_plain_tree_is_none(tmp_path):
    loop: dict = {"seed": 1}
    loop["self"] = loop
    assert saved_config(_data_pkl(tmp_path / "loop.ckpt", pickle.dumps({KEY: loop}, protocol=2))) is None
    odd = {"seed": 1, "x": torch.nn.Linear(1, 1)}   # a placeholder inside it
    assert saved_config(_data_pkl(tmp_path / "odd.ckpt", pickle.dumps({KEY: odd}, protocol=2))) is None


def test_weights_alone_are_no_training_checkpoint(tmp_path):
    from scalelab.resume_checks import weights_only_problem

    torch.save(torch.nn.Linear(2, 2).state_dict(), tmp_path / "weights.pt")
    assert "is no Lightning training checkpoint" in weights_only_problem(tmp_path / "weights.pt")
    _lightning_like(tmp_path / "train.ckpt")   # Lightning's state_dict entry beside the loops' state
    torch.save({"pytorch-lightning_version": "2.6", "global_step": 3, "optimizer_states": []}, tmp_path / "lit.ckpt")
    assert weights_only_problem(tmp_path / "train.ckpt") is None and weights_only_problem(tmp_path / "lit.ckpt") is None
    assert weights_only_problem(tmp_path) is None   # a folder: its own checks
    torch.save({"pytorch-lightning_version": "2.6", "state_dict": {"w": torch.ones(1)}}, tmp_path / "w.ckpt")
    assert "is a weights-only Lightning checkpoint" in weights_only_problem(tmp_path / "w.ckpt")

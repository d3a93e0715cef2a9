"""Your own records end to end through `scalelab-train` as a user runs it: a JSON Lines file,
named relative to where the command runs, trains (the formats and their errors are unit tests:
tests/unit/test_data_formats.py)."""
from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
import yaml

from ..conftest import BASE, train
from ..unit.test_data_split import write_text

pytestmark = pytest.mark.integration


def test_a_jsonl_file_trains(tmp_path):
    rows = [{"id": i, "body": write_text(tmp_path / f"s{i}.txt", 15_000, seed=i).read_text()} for i in range(4)]
    (tmp_path / "notes.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    job = tmp_path / "job"
    train([*BASE, "logger=none", "data=hub", "data.hub_name=notes.jsonl", "data.text_column=body",
           "strategy=single", "trainer.devices=1", "trainer.max_steps=4", f"hydra.run.dir={job}"], tmp_path)
    rec = json.loads((job / "run.json").read_text())
    assert rec["status"] == "completed" and rec["steps"] == 4
    prepared = Path(yaml.safe_load((job / "config_resolved.yaml").read_text())["job"]["data_prepared"])
    meta = json.loads((prepared / "meta.json").read_text())
    shutil.rmtree(prepared, ignore_errors=True)
    # 4 records of 15,000 bytes and 3 separators: 60,003 bytes, 923 blocks of 65, 18 held out
    assert (meta["source"], meta["documents"], meta["bytes"]) == ("hub", 4, 60_000)
    assert (meta["blocks"], meta["val_blocks"]) == (923, 18)

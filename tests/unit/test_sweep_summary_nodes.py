"""launcher=torchrun multirun on a node without global rank 0: its jobs' records are on node 0, so
its command aggregates nothing (no empty sweep.json, no report.html of dashes) and says where."""
from __future__ import annotations

import json

from omegaconf import OmegaConf

from scalelab.results import callbacks


def test_a_node_without_rank_0_leaves_the_sweep_to_node_0(tmp_path, capsys, monkeypatch):
    job = tmp_path / "0"
    job.mkdir()
    (job / "run.json").write_text(json.dumps({"status": "completed", "node_rank": 1, "record_on_node": 0}))
    monkeypatch.setattr(callbacks, "OTHER_NODE", [1, 1])
    cfg = OmegaConf.create({"hydra": {"sweep": {"dir": str(tmp_path)}}, "logger": {"name": "none"}})
    callbacks.SweepSummary().on_multirun_end(cfg)
    out = capsys.readouterr().out
    assert "node 1's part of 2 job(s) is done; the records, sweep.json and report.html are written on node 0" in out
    assert sorted(p.name for p in tmp_path.iterdir()) == ["0"]   # nothing written besides the job

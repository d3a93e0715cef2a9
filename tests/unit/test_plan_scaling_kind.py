"""Plan's scaling efficiency keeps the micro-batch per data-parallel replica; at dp 1 (tp, pipeline)
the baseline runs the job's own global batch, which is strong scaling, not weak as it was labelled."""
import json

import pytest

from scalelab.cli import main

BASE = ["plan", "--params", "125M", "--vocab", "50304", "--devices", "2", "--hardware", "h100_sxm"]


def _plan(argv, capsys):
    with pytest.raises(SystemExit) as done:
        main(argv)
    out = capsys.readouterr()
    assert done.value.code == 0, out.err
    return out.out


def test_tp_at_dp_1_is_strong_scaling(capsys):
    # tp 2 on 2 devices, global batch 1: dp 1, micro-batch 1; the baseline single@1: batch 1
    doc = json.loads(_plan([*BASE, "--strategy", "tp", "--global-batch", "1", "--json"], capsys))
    assert doc["inputs"]["parallel"]["dp"] == 1
    assert doc["baseline"]["global_batch"] == 1 == doc["inputs"]["parallel"]["global_batch"]
    assert doc["scaling_kind"] == "strong"
    text = _plan([*BASE, "--strategy", "tp", "--global-batch", "1"], capsys)
    assert "strong-scaling efficiency (same global batch)" in text and "weak-scaling" not in text


def test_pipeline_at_dp_1_is_strong_scaling(capsys):
    # pipeline pp 2, global batch 8: dp 1, 4 pp = 8 micro-batches, the baseline single@1 at 1 x 8
    doc = json.loads(_plan([*BASE, "--strategy", "pipeline", "--global-batch", "8", "--json"], capsys))
    assert doc["inputs"]["parallel"]["dp"] == 1 and doc["inputs"]["parallel"]["global_batch"] == 8
    assert doc["scaling_kind"] == "strong"


def test_ddp_is_weak_scaling_per_replica(capsys):
    # ddp on 2 devices, global batch 2: dp 2, the baseline single@1: batch 1
    doc = json.loads(_plan([*BASE, "--strategy", "ddp", "--global-batch", "2", "--json"], capsys))
    assert doc["baseline"]["global_batch"] == 1 and doc["inputs"]["parallel"]["global_batch"] == 2
    assert doc["scaling_kind"] == "weak"
    text = _plan([*BASE, "--strategy", "ddp", "--global-batch", "2"], capsys)
    assert "weak-scaling efficiency (same micro-batch per data-parallel replica)" in text

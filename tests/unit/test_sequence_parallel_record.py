"""run.json says sequence_parallel only where it ran: at a TP degree of 1 (tp on one rank with
tensor_parallel_size auto or 1, nd's default tp=1) there is no sequence to shard and no TP plan is
applied, so a run that asked for it must not read (in compare, the dashboard, the planner's
validation) as sequence-parallel."""
from __future__ import annotations

import pytest

from scalelab.strategies import pipeline
from scalelab.strategies.nd import ND
from scalelab.strategies.tensor_parallel import TensorParallel


@pytest.mark.parametrize("tp_size, world, want", [
    ("auto", 1, False),   # auto = all ranks: one
    (1, 2, False),        # two dp replicas of an unsharded model
    ("auto", 2, True),
    (2, 4, True),         # tp 2 x dp 2
])
def test_tp_records_sequence_parallel_at_its_tp_degree(tp_size, world, want):
    plan = TensorParallel(tensor_parallel_size=tp_size, sequence_parallel=True)
    assert plan.record_fields([{}] * world, warmup_steps=0) == {"sequence_parallel": want}
    assert TensorParallel(tensor_parallel_size=tp_size).record_fields([{}] * world, 0) == {"sequence_parallel": False}


@pytest.mark.parametrize("tp, want", [(1, False), (2, True)])
def test_nd_records_sequence_parallel_at_its_tp_degree(monkeypatch, tp, want):
    # the pipeline part of the record is not what this guards: a stand-in with its one key
    monkeypatch.setattr(pipeline.Pipeline, "record_fields", lambda self, *a, **k: {"pipeline": {}})
    plan = ND(tp=tp, pp=2, sequence_parallel=True)
    assert plan.record_fields([{"coords": None}] * 4, warmup_steps=0)["nd"]["sequence_parallel"] is want

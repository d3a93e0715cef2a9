"""Interleaved 1F1B (strategy.stages_per_rank) and the balanced split (strategy.split) end to end:
real multi-rank runs through scalelab-train. All slow (the default suite checks the options'
validation and the stage construction in tests/unit/test_pipeline_split.py).

Reference: `single` on the same 4-layer gpt_nano (model.arch.n_layers=4: 2 pipeline ranks x 2
virtual stages of one layer), 20 steps, SGD with momentum (linear in the gradient: a gradient off
by a constant factor shows; tests/conftest.py SGD). Tolerance 1e-4 relative, as the other
pipeline / nd equivalence tests (the same fp32 sums in another order). Measured 2026-11-30 on
this 2-core CPU: pipeline pp2 x v2 1.2e-7 over steps 1-10 and 3.2e-7 over the resumed 11-20;
nd pp2 x v2 x tp2 with sequence_parallel 1.2e-7; nd pp2 x v2 x dp2 (FSDP roots per chunk) 1.6e-7,
resumed 3.9e-6. Wall: ~16 s per 2-rank job, ~20-36 s per 4-rank job.
"""
from __future__ import annotations

import pytest
import torch

from ..conftest import assert_same_curve, assert_trained_from_seeded_init, worker_pids
from ..conftest import read_record as _rec
from ..conftest import run_one_job as _job

pytestmark = [pytest.mark.integration, pytest.mark.slow]

REL = 1e-4
FOUR = ["model.arch.n_layers=4"]
INTERLEAVED = ["strategy.schedule=interleaved_1f1b", "strategy.stages_per_rank=2"]


@pytest.fixture(scope="module")
def single4(tmp_path_factory) -> dict:
    return _rec(_job(tmp_path_factory, "single4", ["strategy=single", "trainer.devices=1", "trainer.max_steps=20",
                                                   *FOUR]))


@pytest.fixture(scope="module")
def interleaved(tmp_path_factory) -> dict:
    a = _job(tmp_path_factory, "ilv_a", ["strategy=pipeline", "trainer.devices=2", "trainer.max_steps=10", *FOUR,
                                         *INTERLEAVED, "checkpoint.save=true", "checkpoint.export_consolidated=true"])
    ckpt = a / "checkpoints" / "last.ckpt"
    b = _job(tmp_path_factory, "ilv_b", ["strategy=pipeline", "trainer.devices=2", "trainer.max_steps=20", *FOUR,
                                         *INTERLEAVED, f"checkpoint.resume_from={ckpt}"])
    return {"saved": a, "resumed": b, "ckpt": ckpt}


def test_interleaved_matches_single_and_resumes(interleaved, single4):
    rec = _rec(interleaved["saved"])
    p = rec["pipeline"]
    assert rec["status"] == "completed" and rec["parallel"] == {"dp": 1, "tp": 1, "pp": 2}
    assert p["schedule"] == "interleaved_1f1b" and p["stages_per_rank"] == 2
    # virtual stage k on rank k % 2: rank 0 holds layers 0 and 2, rank 1 layers 1 and 3
    assert p["layers_per_virtual_stage"] == [1, 1, 1, 1] and p["stage_layers"] == [[0, 2], [1, 3]]
    assert p["bubble_predicted"] == pytest.approx(1 / 8)      # (p-1)/(v m) = 1/(2 x 4)
    assert len(p["bubble_per_stage"]) == 2
    assert_same_curve(rec, single4, range(1, 11), REL)
    assert_same_curve(_rec(interleaved["resumed"]), single4, range(11, 21), REL)
    assert len(list(interleaved["ckpt"].glob("*.distcp"))) == 2


def test_interleaved_export_loads_strict(interleaved):
    from scalelab.models.gpt import GPT, GPTConfig

    state = torch.load(interleaved["saved"] / "model_consolidated.pt", map_location="cpu", weights_only=True)
    GPT(GPTConfig(n_layers=4)).load_state_dict(state, strict=True)   # all four layers, plain names
    assert_trained_from_seeded_init(state, _rec(interleaved["saved"]))
    for job in (interleaved["saved"], interleaved["resumed"]):
        assert worker_pids(job) == []


@pytest.mark.parametrize("layout, devices, options", [
    ("pp2_v2_tp2_sp", 4, ["strategy.pp=2", "strategy.tp=2", "strategy.sequence_parallel=true"]),
    ("pp2_v2_dp2", 4, ["strategy.pp=2"]),
])
def test_nd_interleaved_matches_single(layout, devices, options, tmp_path_factory, single4):
    job = _job(tmp_path_factory, f"nd_{layout}", ["strategy=nd", f"trainer.devices={devices}", "trainer.max_steps=10",
                                                  *FOUR, *INTERLEAVED, *options, "checkpoint.export_consolidated=true"])
    rec = _rec(job)
    assert rec["nd"]["layers_per_stage"] == [2, 2] and rec["nd"]["stage_layers"] == [[0, 2], [1, 3]]
    assert_same_curve(rec, single4, range(1, 11), REL)
    from scalelab.models.gpt import GPT, GPTConfig

    GPT(GPTConfig(n_layers=4)).load_state_dict(torch.load(job / "model_consolidated.pt", weights_only=True),
                                               strict=True)


def test_balanced_split_runs_the_modelled_split(tmp_path_factory):
    """vocab 1024 makes the head + loss 1.18 blocks (tests/unit/test_pipeline_split.py): balanced
    puts 3 of 4 layers on stage 0 and 1 with the head on stage 1; the same curve as single on that
    model; run.json records the split, the modelled cost and the measured bubble of each stage."""
    model = [*FOUR, "model.arch.vocab_size=1024"]
    ref = _rec(_job(tmp_path_factory, "single_v1024", ["strategy=single", "trainer.devices=1", "trainer.max_steps=10",
                                                       *model]))
    rec = _rec(_job(tmp_path_factory, "balanced", ["strategy=pipeline", "trainer.devices=2", "trainer.max_steps=10",
                                                   *model, "strategy.split=balanced"]))
    p = rec["pipeline"]
    assert p["split"] == "balanced" and p["layers_per_stage"] == [3, 1] and p["stage_layers"] == [[0, 1, 2], [3]]
    # hand: 3 x 114,688 + 64 and 114,688 + 135,680 (forward FLOPs per token)
    assert p["modelled_fwd_flops_per_stage"] == [344_128, 250_368]
    assert len(p["bubble_per_stage"]) == 2 and all(b >= 0 for b in p["bubble_per_stage"])
    assert_same_curve(rec, ref, range(1, 11), REL)

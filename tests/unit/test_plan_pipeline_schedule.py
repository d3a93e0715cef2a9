"""Plan applies scalelab-train's pipeline schedule checks (strategies/pipeline.Pipeline._check_schedule)
to every pipeline and nd layout, suggestions included: `plan --params 34B --vocab 50304 --seq-len 8192
--strategy tp --devices 8 --micro-batch 1 --global-batch 1` suggested "strategy=pipeline + 32 devices
(micro-batch 1 x 1 pipeline micro-batches ...)", 1 micro-batch over 32 stages, which 1f1b refuses."""
import json
from dataclasses import replace
from itertools import product

import pytest

from scalelab.plan.spec import ModelSpec, PlanError, get_strategy, pipeline_schedule_refusal
from scalelab.plan.step_time import build_terms
from ..conftest import run_cli as _run

CMD = ["plan", "--params", "34B", "--vocab", "50304", "--seq-len", "8192", "--strategy", "tp", "--devices", "8",
       "--micro-batch", "1", "--global-batch", "1", "--hardware", "h100_sxm"]
MODEL = ModelSpec.trainer_gpt(8, 256, 4, 512, 64)


def test_no_suggestion_is_a_pipeline_the_trainer_refuses(capsys):
    code, out = _run([*CMD, "--json"], capsys)
    alts = json.loads(out.out)["alternatives"]
    assert code == 1 and alts
    for a in alts:
        if a["strategy"] in ("pipeline", "nd"):
            assert a["micro_batches"] >= a["pp"], a      # default schedule 1f1b
    # global batch 1: one micro-batch, so no pipeline of 2+ stages under 1f1b at all
    assert not [a for a in alts if a["strategy"] == "pipeline" and a["pp"] > 1]
    code, out = _run(CMD, capsys)
    assert "strategy=pipeline" not in out.err


def test_plan_refuses_what_1f1b_refuses_and_gpipe_takes_it():
    pipe = get_strategy("pipeline")
    # 8 devices, pp 8, dp 1, micro-batch 1: global batch 4 = 4 micro-batches < 8 stages
    with pytest.raises(PlanError, match="fewer than the 8 pipeline stages"):
        build_terms(MODEL, pipe, devices=8, pp=8, global_batch=4)
    assert build_terms(MODEL, pipe, devices=8, pp=8, global_batch=8).layout.micro_batches == 8
    gpipe = replace(pipe, pipeline_schedule="gpipe")
    assert build_terms(MODEL, gpipe, devices=8, pp=8, global_batch=4).layout.micro_batches == 4


def test_nd_with_stages_gets_the_same_checks():
    nd = get_strategy("nd")
    # nd tp 1 pp 4 on 4 devices: dp 1, global batch 2 = 2 micro-batches < 4 stages
    with pytest.raises(PlanError, match="strategy=nd: strategy.microbatches=2 is fewer than the 4"):
        build_terms(MODEL, nd, devices=4, tp=1, pp=4, global_batch=2)
    assert build_terms(MODEL, nd, devices=4, tp=1, pp=4, global_batch=4).layout.pp == 4


def test_interleaved_rules():
    inter = replace(get_strategy("pipeline"), pipeline_schedule="interleaved_1f1b", stages_per_rank=2)
    # pp 4, m 9: max(1, 9 // 4) = 2 rounds, which do not divide 9
    with pytest.raises(PlanError, match="= 2 rounds, which must divide m"):
        build_terms(MODEL, inter, devices=4, pp=4, global_batch=9)
    assert build_terms(MODEL, inter, devices=4, pp=4, global_batch=8).layout.stages_per_rank == 2
    # 8 layers: pp 8 x 2 = 16 virtual stages
    with pytest.raises(PlanError, match="16 virtual stages but the model has 8 layers"):
        build_terms(MODEL, inter, devices=8, pp=8, global_batch=16)


def test_plan_and_trainer_agree():
    """The rule plan applies against the trainer's check (one rule, plan.spec), over gpipe, 1f1b and interleaved_1f1b."""
    from scalelab.errors import ConfigError
    from scalelab.strategies.pipeline import Pipeline

    checked = 0
    for schedule, pp, m, v, layers in product(("gpipe", "1f1b", "interleaved_1f1b"), (1, 2, 3, 4, 8),
                                              range(1, 19), (1, 2, 3), (4, 8, 12)):
        if (schedule == "interleaved_1f1b") != (v > 1):
            continue                             # the trainer's constructor refuses the pair
        trainer = Pipeline(schedule=schedule, microbatches=m, stages_per_rank=v)
        try:
            trainer._check_schedule(pp, layers, "stages")
            refused = False
        except ConfigError:
            refused = True
        assert (pipeline_schedule_refusal(schedule, pp, m, v, layers) is not None) == refused, \
            (schedule, pp, m, v, layers)
        checked += 1
    assert checked > 500

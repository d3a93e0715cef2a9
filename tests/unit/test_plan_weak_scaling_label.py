"""plan's scaling efficiency is weak scaling (same micro-batch per device, step_time.baseline) and
says so: it printed "scaling efficiency 58.7% vs single on 1 device" (the baseline at batch 16 for a
job at 512) while a sweep's table reports strong scaling under the same word."""
import json

import pytest

from ..conftest import run_cli as _run

JOB = ["plan", "strategy=zero3", "model=gpt_small", "trainer.devices=8", "trainer.num_nodes=4",
       "data.global_batch_size=512", "trainer.precision=bf16-mixed", "hardware_profile=h100_sxm"]


def test_the_efficiency_is_labelled_weak_scaling_with_the_baselines_batch(capsys):
    code, out = _run([*JOB, "--json"], capsys)
    doc = json.loads(out.out)
    assert code == 0 and doc["scaling_kind"] == "weak"
    base = doc["baseline"]
    # 512 sequences over 32 ranks: micro-batch 16 per device, so single on 1 device runs batch 16
    assert (base["world_size"], base["micro_batch"], base["global_batch"]) == (1, 16, 16)
    # weak scaling at the same micro-batch: (512 / step) / (32 x 16 / base step) = base step / step
    assert doc["scaling_efficiency"] == pytest.approx(base["step_s"] / doc["time"]["step_s"])
    code, out = _run(JOB, capsys)
    line = next(ln for ln in out.out.splitlines() if "efficiency" in ln)
    assert (f"weak-scaling efficiency (same micro-batch per data-parallel replica) {doc['scaling_efficiency']:.1%} vs single "
            "on 1 device at global batch 16") in line


def test_the_strategy_table_says_weak_scaling(capsys):
    code, out = _run(["plan", "--params", "1B", "--strategy", "ddp,fsdp", "--devices", "8"], capsys)
    assert code == 0 and "efficiency: weak-scaling efficiency (same micro-batch per data-parallel replica)" in out.out.splitlines()[0]

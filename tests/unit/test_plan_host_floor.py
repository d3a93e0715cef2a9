"""`scalelab plan --calibrate` on GPU runs: host-bound runs get a host floor, not the device rates.

A fake GPU sweep whose step times come from a known "true" GPU: single and ddp device-bound,
fsdp and zero3 host-bound (their floor per layer x micro-batch is above their device time).
Calibration from a prior that knows no floors must find which runs are host-bound, recover
each floor exactly (measured step / (layers x micro-batches): the truth we set), fit the device
rates on the device-bound runs only, drop a stale floor of a strategy the sweep shows
device-bound, and keep the floor of a strategy it did not run.
"""
import json
from dataclasses import replace

import pytest

from scalelab.plan import Hardware, Link, calibrate
from scalelab.plan.run_records import terms_from_run
from scalelab.plan.step_time import step_time

from .test_plan_calibrate import run_record

GPU = Hardware(
    name="true_gpu", kind="gpu", peak_flops={"fp32": 60e12, "bf16": 900e12}, memory_bytes=80e9,
    memory_bandwidth_bytes_per_s=3e12, intra_node=Link(300e9, 1e-6), inter_node=Link(40e9, 5e-6),
    devices_per_node=8, compute_efficiency=0.5, comm_overlap=0.9, step_overhead_s=0.002,
    strategy_host_layer_s={"fsdp": 4e-3, "zero3": 9e-3})
PRIOR = replace(GPU, name="prior_gpu", compute_efficiency=0.3, step_overhead_s=0.001,
                strategy_host_layer_s={"ddp": 5e-3, "tp": 7e-3})   # ddp's is stale, tp not in the sweep
# (model, strategy, micro-batch): gpt_nano has 2 layers, gpt_small 4 (test_plan_calibrate.MODELS)
RUNS = [("gpt_nano", "single", 8), ("gpt_nano", "single", 64), ("gpt_small", "single", 32),
        ("gpt_small", "ddp", 16), ("gpt_nano", "fsdp", 8), ("gpt_small", "fsdp", 8), ("gpt_small", "zero3", 8)]


def gpu_sweep(root, accelerator: str = "cuda"):
    for i, (model, strategy, micro) in enumerate(RUNS):
        rec = run_record(model, strategy, 1, micro)
        rec["hardware"] = {"accelerator": accelerator, "threads_per_rank": 16}
        rec.pop("host_speed")
        t = step_time(terms_from_run(rec), GPU)["step_s"]
        rec["step_time_s"] = {"median": t, "p90": t, "mean": t}
        (root / str(i)).mkdir(parents=True)
        (root / str(i) / "run.json").write_text(json.dumps(rec))
    return root


def test_truth_sweep_has_host_and_device_bound_runs(tmp_path):
    """The premise, by hand: fsdp's 2-layer run takes 2 x 4 ms, zero3's 4-layer run 4 x 9 ms (their
    floors), and both are above their device-bound time; single's are not floors."""
    sweep = gpu_sweep(tmp_path)
    recs = [json.loads((sweep / str(i) / "run.json").read_text()) for i in range(len(RUNS))]
    assert recs[4]["step_time_s"]["median"] == pytest.approx(2 * 4e-3)
    assert recs[6]["step_time_s"]["median"] == pytest.approx(4 * 9e-3)
    no_floor = replace(GPU, strategy_host_layer_s={})
    for r in recs[4:]:
        assert step_time(terms_from_run(r), no_floor)["step_s"] < 0.8 * r["step_time_s"]["median"]
    for r in recs[:4]:
        assert step_time(terms_from_run(r), no_floor)["step_s"] == pytest.approx(r["step_time_s"]["median"])


def test_calibrate_finds_the_host_bound_runs_and_their_floors(tmp_path):
    hw, rep = calibrate(str(gpu_sweep(tmp_path)), PRIOR)
    assert [r["host_bound"] for r in rep["runs"]] == [False] * 4 + [True] * 3
    assert hw.strategy_host_layer_s == pytest.approx({"fsdp": 4e-3, "zero3": 9e-3, "tp": 7e-3})
    # the device rates come from the device-bound runs alone: the truth's, not dragged by fsdp/zero3
    assert hw.compute_efficiency == pytest.approx(0.5, rel=0.05)
    assert all(r["ratio"] == pytest.approx(1.0, rel=0.05) for r in rep["runs"])
    assert rep["runs"][4]["loo_ratio"] is None and rep["runs"][0]["loo_ratio"] is not None


def test_a_cpu_profile_gets_no_floor(tmp_path):
    """On a CPU the host computes: its Python time is in the step the linear terms fit."""
    cpu = replace(PRIOR, kind="cpu", strategy_host_layer_s={})
    hw, rep = calibrate(str(gpu_sweep(tmp_path, accelerator="cpu")), cpu)   # (a CPU profile fits CPU runs only)
    assert hw.strategy_host_layer_s == {} and not any(r["host_bound"] for r in rep["runs"])

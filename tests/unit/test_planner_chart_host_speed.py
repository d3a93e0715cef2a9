"""The dashboard's planner step-time chart predicts each run at the host speed `plan --validate`
uses: the median probe of its sweep's neighbouring jobs (plan/run_records.smooth_host_speeds), not
the run's own probe (its note said "as plan --validate does", while a run whose probe read 0.43
of reference showed 41.5 ms predicted against --validate's 25.2 ms)."""
import pytest
import yaml

from scalelab.plan.hardware import host_cpu_profile_path, load_hardware
from scalelab.plan.validate import validate
from scalelab.results import charts
from scalelab.results.record import read_records, write_json

from .test_report import NANO, _rec

PROFILE = {"name": "this_cpu", "peak_flops": {"fp32": 1.0e11, "bf16": 1.0e11, "fp16": 1.0e11},
           "memory_bytes": 1.2e10, "memory_bandwidth_bytes_per_s": 1.0e10,
           "intra_node": {"bandwidth_bytes_per_s": 1.3e9, "latency_s": 1e-4},
           "inter_node": {"bandwidth_bytes_per_s": 1.25e8, "latency_s": 1e-4},
           "devices_per_node": 2, "threads_per_device": 1, "compute_efficiency": 0.6, "step_overhead_s": 0.003,
           "runtime_memory_bytes": 3.5e8, "kind": "cpu", "note": "a test profile"}


def test_the_chart_predicts_at_validate_s_smoothed_host_speed(tmp_path):
    cache, sweep = tmp_path / "cache", tmp_path / "sweep"
    path = host_cpu_profile_path(cache)
    path.parent.mkdir(parents=True)
    path.write_text(yaml.safe_dump(PROFILE))
    for num, flops in enumerate([1.0e11, 0.43e11, 1.0e11]):     # job 1's own probe: 0.43 of reference
        rec = _rec(num, "ddp", 2, 16, 100.0, model=NANO, mfu={"value": 0.1, "hardware_profile": "this_cpu"},
                   host_speed={"flops": flops}, seed=1234)
        rec["job"].update(sweep_dir=str(sweep), num=num)
        (sweep / str(num)).mkdir(parents=True)
        write_json(sweep / str(num) / "run.json", rec)
    step, _ = charts.planner(read_records([sweep]), cache)
    predicted = dict(zip(step["traces"][1]["x"], step["traces"][1]["y"]))
    by_validate = {f"fx/{r['run'].rsplit('/', 1)[1]}": r["predicted_step_s"] * 1e3
                   for r in validate(sweep, load_hardware("this_cpu", cache))["runs"]}
    assert predicted == pytest.approx(by_validate) and len(predicted) == 3
    # the median of the three probes is the reference: each is predicted at speed 1, job 1 too
    assert predicted["fx/1"] == pytest.approx(predicted["fx/0"])


def test_a_probe_only_cpu_profile_is_said_to_be_unfitted(tmp_path):
    """`make run`'s dashboard: this_cpu predicted its step times 36 % over and RSS 32 % under, with
    no word that the profile is the probe's defaults until `plan --calibrate` fits it."""
    cache, sweep = tmp_path / "cache", tmp_path / "sweep"
    path = host_cpu_profile_path(cache)
    path.parent.mkdir(parents=True)
    path.write_text(yaml.safe_dump(PROFILE))
    rec = _rec(0, "ddp", 2, 16, 100.0, model=NANO, mfu={"value": 0.1, "hardware_profile": "this_cpu"},
               host_speed={"flops": 1.0e11}, seed=1234)
    rec["job"].update(sweep_dir=str(sweep), num=0)
    (sweep / "0").mkdir(parents=True)
    write_json(sweep / "0" / "run.json", rec)
    step, _ = charts.planner(read_records([sweep]), cache)
    assert step["notes"][1] == ("this_cpu is this host's matmul probe with default rates, not fitted to runs: "
                                "`scalelab plan --calibrate` fits them (README, Planning beyond this machine)")

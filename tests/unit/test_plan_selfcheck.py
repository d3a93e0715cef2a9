"""The planner's self-checks (--calibrate / --validate) do not pass what they cannot judge.

Records are built by hand from test_plan_calibrate's "true" machine (no training): a sweep with no
usable run, a short run, a one-run calibration, a compute rate fitted to 0, a host slower than the
profile's reference, memory off, runs of another accelerator, a profile used on another host.
"""
import json
from dataclasses import replace

import pytest

from scalelab.plan import calibrate, load_hardware, save_hardware, validate
from scalelab.plan import hardware
from scalelab.plan.peak_memory import device_total_bytes
from scalelab.plan.run_records import terms_from_run
from scalelab.plan.spec import PlanError
from scalelab.plan.step_time import step_time

from ..conftest import run_cli
from .test_plan_calibrate import PRIOR, TRUE, main, run_record

GPU = replace(TRUE, name="true_gpu", kind="gpu", compute_efficiency_by={}, busy_slowdown={})


def write(root, name, rec):
    (root / name).mkdir(parents=True)
    (root / name / "run.json").write_text(json.dumps(rec))
    return root


def exact(model="gpt_nano", strategy="ddp", world=2, micro=8, speed=1.0, hw=TRUE, **kw):
    """A run on `hw` whose probe read `speed` x the profile's reference and whose steps took the
    truth's step time / speed (no noise)."""
    rec = run_record(model, strategy, world, micro, **kw)
    rec["host_speed"]["flops"] = speed * TRUE.peak("fp32") * kw.get("threads", 1)
    rec["step_time_s"]["median"] = step_time(terms_from_run(rec), hw)["step_s"] / speed
    return rec


def test_a_sweep_without_a_usable_run_is_an_error_with_the_reasons(tmp_path, capsys):
    """Every run failed: --validate printed "0 runs" and passed --tolerance (exit 0)."""
    write(tmp_path, "0", {"status": "failed", "error": "boom"})
    write(tmp_path, "1", {"status": "failed", "error": "out of memory\nTraceback ..."})
    prof = save_hardware(TRUE, tmp_path.parent / "true.yaml")
    for mode in ("--validate", "--calibrate"):
        code, cap = run_cli(["plan", mode, str(tmp_path), "--hardware", str(prof)], capsys)
        assert code == 2 and cap.err.count("\n") == 1, cap.err
        assert cap.err == (f"error: no usable run under {tmp_path}: 2 skipped "
                           "(status 'failed': boom; status 'failed': out of memory)\n")


def test_a_short_run_is_skipped_not_fitted(tmp_path):
    """A run with fewer steady steps than MIN_MEASURED_STEPS (5): its median held a 3x slower
    warm-up step and was judged 0.333 (and fitted) with full weight."""
    write(tmp_path, "ok", exact())
    short = exact()
    short.update(short_run=True)
    short["step_time_s"].update(measured_steps=1, warmup_steps_excluded=1, median=3 * short["step_time_s"]["median"])
    write(tmp_path, "short", short)
    four = exact()                                # older record: no short_run flag, 4 steps
    four["step_time_s"]["measured_steps"] = 4
    write(tmp_path, "four", four)
    five = exact()
    five["step_time_s"]["measured_steps"] = 5     # enough: MIN_MEASURED_STEPS
    write(tmp_path, "five", five)
    rep = validate(tmp_path, TRUE)
    assert sorted(r["run"].rsplit("/", 1)[1] for r in rep["runs"]) == ["five", "ok"]
    assert {s["run"].split("/")[-2]: s["reason"].split(":")[0] for s in rep["skipped"]} == \
        {"short": "short run", "four": "short run"}
    assert "4 measured step(s), fewer than 5" in next(s["reason"] for s in rep["skipped"] if "/four/" in s["run"])
    assert rep["max_step_error"] == pytest.approx(0.0, abs=1e-12)


def test_a_calibration_with_fewer_runs_than_terms_is_flagged(tmp_path, capsys):
    """One run fits its 8 terms exactly (rms 4e-16, compute efficiency left at the prior's 0.3 where
    the truth is 0.55): saved as `underdetermined: true`, with a warning line."""
    write(tmp_path / "one", "0", exact())
    prior = save_hardware(PRIOR, tmp_path / "prior.yaml")
    out = tmp_path / "one.yaml"
    assert main(["--calibrate", str(tmp_path / "one"), "--hardware", str(prior), "--out", str(out)]) == 0
    err = capsys.readouterr().err
    assert err.startswith("warning: 1 runs for 8 fitted terms, no leave-one-out: ") and err.count("\n") == 1, err
    cal = load_hardware(str(out)).calibration
    assert cal["underdetermined"] is True and cal["fitted_runs"] == 1 and len(cal["fitted_terms"]) == 8
    # `single` at 4 batch sizes x fp32/bf16: 7 terms (overhead, per micro-batch, per layer, compute
    # fp32@1 and bf16@1, activation and optimizer memory); 8 runs are enough (7 + 1), 7 are not
    cfgs = [dict(micro=m, precision=p) for m in (4, 8, 16, 32) for p in ("32-true", "bf16-mixed")]
    for i, c in enumerate(cfgs):
        write(tmp_path / "many", str(i), exact(strategy="single", world=1, **c))
    hw, rep = calibrate(tmp_path / "many", PRIOR)
    assert (hw.calibration["fitted_runs"], len(rep["theta"])) == (8, 7)
    assert hw.calibration["underdetermined"] is False
    (tmp_path / "many" / "7" / "run.json").unlink()
    assert calibrate(tmp_path / "many", PRIOR)[0].calibration["underdetermined"] is True


def test_leave_one_out_predicts_with_the_profile_it_would_save(tmp_path):
    """bf16 runs faster than anything but a free matmul (0.2 x the truth's non-compute time) drive
    compute:bf16@1 to 0; the saved profile then keeps the generic efficiency (apply_theta), so it
    predicts them 50x+ too slow. Leave-one-out summed the raw theta (compute free) and called them
    right (1.00): it now says what the saved profile says."""
    free_bf16 = replace(TRUE, peak_flops={**TRUE.peak_flops, "bf16": 1e18})
    for i, m in enumerate((4, 8, 16, 32)):
        write(tmp_path, f"fp32_{m}", exact(strategy="single", world=1, micro=m))
        rec = exact(strategy="single", world=1, micro=m, precision="bf16-mixed", hw=free_bf16)
        rec["step_time_s"]["median"] *= 0.2
        write(tmp_path, f"bf16_{m}", rec)
    hw, rep = calibrate(tmp_path, PRIOR)
    assert rep["theta"]["compute:bf16@1"] == 0.0 and "bf16@1" not in hw.compute_efficiency_by
    for r in rep["runs"]:
        if "bf16" in r["run"]:
            m = int(r["run"].rsplit("_", 1)[1])
            t = terms_from_run(run_record("gpt_nano", "single", 1, m, precision="bf16-mixed"))
            # the saved profile's matmul time alone, by hand: FLOPs / (bf16 peak x its efficiency)
            compute = t.hw_flops_per_device / (10e9 * hw.efficiency("bf16", 1))
            assert r["loo_ratio"] > compute / r["measured_step_s"] > 20
            assert r["loo_ratio"] == pytest.approx(r["ratio"], rel=0.02)


def test_validate_judges_the_step_time_as_planned(tmp_path, capsys):
    """The runs' probes read 0.8 of the reference (a mean of n=256 calls against the profile's
    fastest call) and the steps took 1 / 0.8 as long: at that speed the profile is exact (ratio 1),
    and `scalelab plan`, which predicts at the reference, is 0.8 of the measured step. That is the
    ratio --tolerance judges unless the speed-corrected one is asked for."""
    for i, m in enumerate((8, 16)):
        write(tmp_path / "s", str(i), exact(micro=m, speed=0.8))
    rep = validate(tmp_path / "s", TRUE)
    assert [r["step_ratio"] for r in rep["runs"]] == pytest.approx([1.0, 1.0])
    assert [r["step_ratio_raw"] for r in rep["runs"]] == pytest.approx([0.8, 0.8])
    assert rep["max_step_error"] == pytest.approx(0.0, abs=1e-12)
    assert rep["max_step_error_raw"] == pytest.approx(0.2)
    prof = save_hardware(TRUE, tmp_path / "true.yaml")
    argv = ["--validate", str(tmp_path / "s"), "--hardware", str(prof), "--tolerance", "0.15"]
    assert main(argv) == 0                      # at the run's host speed: the prediction holds
    cap = capsys.readouterr()
    assert "ratio as planned" in cap.out and "ratio at host speed" in cap.out
    assert main(argv + ["--as-planned"]) == 1   # as `scalelab plan` prints it: 20 % fast
    assert capsys.readouterr().err == ("error: step-time prediction as planned (profile's reference host speed) "
                                       "(config median) off by 20.0% > tolerance 15.0%\n")


def test_memory_beyond_the_tolerance_fails_it_rss_does_not(tmp_path, capsys):
    """Model-state bytes (exact counts) 2x the prediction and a GPU's device peak 2x: ratio 0.5,
    off by 50 % > 15 %. Peak RSS 3x (ratio 0.333) is reported only: it is noisy."""
    prof = save_hardware(TRUE, tmp_path / "true.yaml")
    states = exact()
    states["memory"]["model_state_bytes_per_rank"] = [2 * b for b in states["memory"]["model_state_bytes_per_rank"]]
    write(tmp_path, "states", states)
    assert main(["--validate", str(tmp_path / "states"), "--hardware", str(prof), "--tolerance", "0.15"]) == 1
    assert capsys.readouterr().err == "error: model-state bytes (worst run) off by 50.0% > tolerance 15.0%\n"
    rss = exact()
    rss["memory"]["peak_rss_bytes_per_rank"] = [3 * b for b in rss["memory"]["peak_rss_bytes_per_rank"]]
    write(tmp_path, "rss", rss)
    assert main(["--validate", str(tmp_path / "rss"), "--hardware", str(prof), "--tolerance", "0.15"]) == 0
    assert "max |peak RSS ratio - 1| = 0.667 (reported, not judged" in capsys.readouterr().out
    gpu = exact(hw=GPU)
    gpu["hardware"] = {"accelerator": "cuda", "threads_per_rank": 8}
    gpu.pop("host_speed")
    gpu["memory"]["peak_device_bytes_per_rank"] = [int(2 * device_total_bytes(terms_from_run(gpu), GPU))] * 2
    write(tmp_path, "gpu", gpu)
    rep = validate(tmp_path / "gpu", GPU)
    assert rep["max_device_error"] == pytest.approx(0.5, rel=1e-6) and rep["max_step_error_raw"] < 1e-9
    gprof = save_hardware(GPU, tmp_path / "gpu.yaml")
    assert main(["--validate", str(tmp_path / "gpu"), "--hardware", str(gprof), "--tolerance", "0.15"]) == 1
    assert capsys.readouterr().err == "error: device memory (worst run) off by 50.0% > tolerance 15.0%\n"


def test_runs_of_another_accelerator_are_refused(tmp_path, capsys):
    """GPU runs calibrated against a CPU profile (no --hardware: this_cpu) gave an rms error of 3688
    and were written over this_cpu_calibrated.yaml."""
    gpu = exact()
    gpu["hardware"] = {"accelerator": "cuda", "threads_per_rank": 8}
    write(tmp_path / "s", "gpu", gpu)
    write(tmp_path / "s", "cpu", exact())
    with pytest.raises(PlanError, match=r"--calibrate: 1 of 2 runs ran on GPU \(e\.g\. .*/s/gpu\) but profile "
                                        r"'prior_cpu' is a CPU profile; give --hardware a GPU profile"):
        calibrate(tmp_path / "s", PRIOR)
    with pytest.raises(PlanError, match="--calibrate: 1 of 2 runs ran on CPU .* profile 'true_gpu' is a GPU profile"):
        calibrate(tmp_path / "s", GPU)
    out = tmp_path / "never.yaml"
    prior = save_hardware(PRIOR, tmp_path / "prior.yaml")
    code, cap = run_cli(["plan", "--calibrate", str(tmp_path / "s"), "--hardware", str(prior), "--out", str(out)], capsys)
    assert code == 2 and cap.err.count("\n") == 1 and not out.exists()
    code, cap = run_cli(["plan", "--validate", str(tmp_path / "s"), "--hardware", str(prior)], capsys)
    assert code == 2 and "--validate: 1 of 2 runs ran on GPU" in cap.err


def test_a_calibrated_cpu_profile_warns_on_another_host(tmp_path, capsys, monkeypatch):
    """A CPU profile's rates are its host's (this_cpu is keyed by _host_key): the calibrated one
    records that key, and using it where the key differs prints one warning line per profile."""
    monkeypatch.setattr(hardware, "_WARNED_HOSTS", set(), raising=False)
    for i, m in enumerate((4, 8, 16)):
        write(tmp_path / "s", str(i), exact(micro=m))
    out = tmp_path / "fit.yaml"
    calibrate(tmp_path / "s", PRIOR, out)
    here = hardware._host_key()
    assert load_hardware(str(out)).calibration["host_key"] == here and capsys.readouterr().err == ""
    monkeypatch.setattr(hardware, "_host_key", lambda: "another-host")
    code, cap = run_cli(["plan", "--params", "100M", "--strategy", "ddp", "--devices", "2", "--global-batch", "2",
                         "--hardware", str(out)], capsys)
    assert code == 0 and cap.err.count("\n") == 1, cap.err
    assert cap.err.startswith(f"warning: hardware profile {out} was calibrated on another host (")
    load_hardware(str(out))
    assert capsys.readouterr().err == ""             # once per profile and process
    # a GPU profile's rates are its devices', not the host's that ran --calibrate: no key
    gpu = exact(hw=GPU)
    gpu["hardware"] = {"accelerator": "cuda", "threads_per_rank": 8}
    write(tmp_path / "g", "0", gpu)
    assert "host_key" not in calibrate(tmp_path / "g", GPU)[0].calibration


def test_other_nodes_parts_are_not_runs(tmp_path):
    """A launcher=torchrun job whose nodes share its folder keeps node K's part in JOB/nodeK/run.json
    beside node 0's JOB/run.json (scalelab.train.node_folder): calibrate/validate's run list holds
    the job once (it listed the part as a skipped run)."""
    from scalelab.plan.run_records import find_runs

    job = tmp_path / "sweep" / "0"
    (job / "node1").mkdir(parents=True)
    (job / "run.json").write_text(json.dumps({"status": "completed", "node_rank": 0}))
    (job / "node1" / "run.json").write_text(json.dumps({"status": "completed", "node_rank": 1, "record_on_node": 0}))
    assert [p for p, _ in find_runs(tmp_path / "sweep")] == [job / "run.json"]

"""The planner reads real run records: --validate and --calibrate on the core sweep's runs."""
import json

import pytest

from scalelab.plan import calibrate, load_hardware, validate

from ..conftest import records

pytestmark = pytest.mark.integration


def test_validate_reads_real_runs_and_predicts_their_model_states(core_sweep):
    rep = validate(core_sweep, load_hardware("this_cpu"))
    assert rep["skipped"] == [] and len(rep["runs"]) == len(records(core_sweep)) == 4
    for r in rep["runs"]:
        # single/ddp hold whole fp32 params + grads + AdamW moments: the formula is exact.
        assert r["model_states_ratio"] == pytest.approx(1.0, abs=0.01), r
        assert r["predicted_step_s"] > 0 and r["measured_step_s"] > 0


def test_calibrate_on_real_runs_then_validate(core_sweep, tmp_path):
    out = tmp_path / "fitted.yaml"
    hw, rep = calibrate(core_sweep, load_hardware("this_cpu"), out)
    assert len(rep["runs"]) == 4 and load_hardware(str(out)).calibration["runs"] == 4
    # Four runs of one model pin few of the rates; what must hold is that the fitted profile
    # reproduces the runs it was fitted on (the out-of-sample check is experiments/plan_validation).
    assert validate(core_sweep, hw)["max_step_error"] < 0.15
    json.dumps(rep)                                       # the --json report is serialisable

"""The planner reads real run records: --validate and --calibrate on the core sweep's runs."""
import json
import math

import pytest

from scalelab.plan import calibrate, load_hardware, validate

from ..conftest import records

pytestmark = pytest.mark.integration


def test_validate_reads_real_runs_and_predicts_their_model_states(core_sweep):
    rep = validate(core_sweep, load_hardware("this_cpu"))
    assert rep["skipped"] == [] and len(rep["runs"]) == len(records(core_sweep)) == 4
    for r in rep["runs"]:
        # single/ddp hold whole fp32 params + grads + SGD momentum (tests/conftest.py SGD): the formula is exact.
        assert r["model_states_ratio"] == pytest.approx(1.0, abs=0.01), r
        assert r["predicted_step_s"] > 0 and r["measured_step_s"] > 0


def test_calibrate_on_real_runs_then_validate(core_sweep, tmp_path):
    out = tmp_path / "fitted.yaml"
    hw, rep = calibrate(core_sweep, load_hardware("this_cpu"), out)
    assert len(rep["runs"]) == 4 and load_hardware(str(out)).calibration["runs"] == 4
    # Four short runs of one model under a loaded test machine pin few rates and carry timing
    # noise, so no accuracy figure is asserted here (that is experiments/plan_validation's job);
    # what must hold is that the least-squares fit explains its own runs better than the prior.
    def rms(profile):
        return math.sqrt(sum((r["step_ratio"] - 1) ** 2 for r in validate(core_sweep, profile)["runs"]) / 4)
    assert all(r["predicted_step_s"] > 0 for r in validate(core_sweep, hw)["runs"])
    assert rms(hw) <= rms(load_hardware("this_cpu")) + 1e-9
    json.dumps(rep)                                       # the --json report is serialisable

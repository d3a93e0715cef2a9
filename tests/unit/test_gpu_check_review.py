"""benchmarks/gpu_check.py as reviewed (2026-12-03): a strategy with no record fails its goal (it
left the table, and with none left the script passed); an earlier sweep in OUT/sweep is refused
(the trainer kept its completed jobs, so their old figures were reported as new)."""
from __future__ import annotations

import importlib.util

import pytest

from ..conftest import REPO


def _gpu_check():
    spec = importlib.util.spec_from_file_location("gpu_check", REPO / "benchmarks" / "gpu_check.py")
    gc = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(gc)
    return gc


def _row(strategy, step=0.0367, plan=0.0399, dev=7.0, pmem=7.2, vs_single=1.0, vs_hand=0.99):
    return {"strategy": strategy, "status": "completed", "step_ratio": plan / step, "mem_ratio": pmem / dev,
            "vs_single": vs_single, "vs_hand": vs_hand}


def test_a_strategy_without_a_record_fails_and_none_left_is_no_pass():
    gc = _gpu_check()
    ok = gc.goals([_row("single"), _row("ddp", vs_single=0.95)])
    assert all(passed for _, passed in ok)                     # 39.9 / 36.7 = 1.087, 7.2 / 7 = 1.029
    cut = gc.goals([_row("single")], missing=["zero3"])
    assert ("zero3: completed (no run.json: not run, cut by the deadline or refused; see sweep.log)", False) in cut
    assert not all(passed for _, passed in gc.goals([], missing=["single", "ddp"]))


def test_an_earlier_sweep_is_refused_in_one_line(tmp_path, capsys):
    gc = _gpu_check()
    (tmp_path / "sweep" / "0").mkdir(parents=True)
    with pytest.raises(SystemExit) as e:
        gc.sweep(gc.SMOKE, ["single"], tmp_path)
    assert e.value.code == 2
    assert capsys.readouterr().err == f"error: {tmp_path / 'sweep'} holds an earlier sweep: give a new --out " \
                                      "(or remove it)\n"


def test_without_a_cuda_device_it_refuses_to_run_as_a_gpu_check(tmp_path):
    """A CPU torch (this checkout's .venv carried along) ran the 86M sweep on CPU until its cut and
    reported it as "GPU" (review): one line, exit 2, before any run. (--smoke is the CPU check.)"""
    import subprocess
    import sys

    proc = subprocess.run([sys.executable, str(REPO / "benchmarks" / "gpu_check.py"), "--out", str(tmp_path / "o")],
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode == 2 and proc.stderr.startswith("error: gpu_check: no CUDA device here (torch "), proc.stderr
    assert proc.stderr.count("\n") == 1 and not (tmp_path / "o").exists()


def test_a_gpu_check_has_a_deadline_by_default():
    gc = _gpu_check()
    assert gc.DEFAULT_DEADLINE_S <= 360          # issue 11: under 6 minutes on one GPU

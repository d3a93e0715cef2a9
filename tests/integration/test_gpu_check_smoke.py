"""benchmarks/gpu_check.py end to end on CPU (--smoke: tiny model, fp32), so the GPU script does
not rot between the sessions that have a GPU. Slow: six jobs plus the planner (~1.5 min)."""
from __future__ import annotations

import json
import subprocess
import sys

import pytest

from ..conftest import REPO, env

pytestmark = [pytest.mark.slow, pytest.mark.integration]


def test_gpu_check_smoke_runs_every_step(tmp_path):
    proc = subprocess.run([sys.executable, str(REPO / "benchmarks" / "gpu_check.py"), "--smoke", "--out",
                           str(tmp_path)], cwd=REPO, env=env(), capture_output=True, text=True, timeout=900)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    doc = json.loads((tmp_path / "gpu_check.json").read_text())
    assert [r["strategy"] for r in doc["rows"]] == ["single", "ddp", "fsdp", "zero2", "zero3", "tp"]
    for r in doc["rows"]:
        assert r["status"] == "completed" and r["plan_step_s"] > 0 and r["vs_hand"] > 0, r
    assert doc["hand"]["model_flops_per_token"] == 6 * (2 * 49_408 + 128 + 16_384) + 12 * 2 * 64 * 64
    assert "| hand-written loop |" in (tmp_path / "gpu_check.md").read_text()

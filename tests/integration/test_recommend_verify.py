"""`scalelab recommend --verify`: the planner's best candidates run as real short jobs through
`scalelab-train -m` (2 gloo ranks), are re-ranked on their run.json figures, and the answer names
a command that trains."""
from __future__ import annotations

import json
import os
import shlex
import subprocess
import sys
import time

import pytest

from ..conftest import env, records

pytestmark = pytest.mark.integration
RECOMMEND = [sys.executable, "-m", "scalelab.cli", "recommend"]


def recommend(args: list[str], cwd, timeout: float) -> tuple[dict, subprocess.CompletedProcess, float]:
    t0 = time.perf_counter()
    proc = subprocess.run(RECOMMEND + args, cwd=cwd, env=env(), capture_output=True, text=True, timeout=timeout)
    wall = time.perf_counter() - t0
    assert proc.returncode == 0, f"exit {proc.returncode}\n{proc.stdout[-3000:]}\n{proc.stderr[-3000:]}"
    out = next(a for a in args if a.startswith("--out=")).split("=", 1)[1]
    return json.loads((cwd / out / "recommendation.json").read_text()), proc, wall


def test_verify_one_candidate_through_the_sweep_machinery(tmp_path):
    doc, proc, _ = recommend(["--model", "gpt_nano", "--devices", "2", "--hardware", "this_cpu", "--verify", "1",
                              "--verify-steps", "8", "--lr-check", "none", "--activation-checkpointing", "none",
                              "--out=rec"], tmp_path, 300)
    v = doc["verification"]
    assert v["k"] == 1 and v["returncode"] == 0
    row = v["ranking"][0]
    assert row["status"] == "completed" and row["measured_tokens_per_s"] > 0 and row["predicted_step_s"] > 0
    # the run is an ordinary sweep job: its run.json, the sweep's sweep.json and dashboard
    runs = records(tmp_path / "rec" / "verify")
    assert len(runs) == 1 and runs[0]["strategy"] == doc["ranking"][0]["strategy"] and runs[0]["steps"] == 8
    assert (tmp_path / "rec" / "verify" / "sweep.json").is_file()
    assert (tmp_path / "rec" / "verify" / "report.html").is_file()
    assert (tmp_path / "rec" / "recommendation.md").is_file() and (tmp_path / "rec" / "recommendation.html").is_file()
    # the winner's command is printed last and is the verified job's own config
    w = doc["winner"]
    assert proc.stdout.rstrip().splitlines()[-1] == w["command"]
    ov = shlex.split(w["command"])[1:]
    assert f"strategy={runs[0]['strategy']}" in ov and "trainer.devices=2" in ov
    assert runs[0]["global_batch_size"] == w["global_batch"] and runs[0]["world_size"] == 2


@pytest.mark.slow
def test_verify_three_for_gpt_small_on_two_ranks_under_five_minutes(tmp_path):
    """The issue's check, as a user types it: --verify 3 (and the LR check it brings) for gpt_small on
    2 ranks in < 5 min, the measured best among the planner's top 3. A wall-time check on a shared
    host: the load average is in the message (measured 112 s at load 3, 202 s at load 5.8)."""
    load = os.getloadavg()[0]
    doc, proc, wall = recommend(["--model", "gpt_small", "--devices", "2", "--hardware", "this_cpu", "--verify", "3",
                                 "--out=rec"], tmp_path, 900)
    assert wall < 300, f"took {wall:.0f} s (1-min load average {load:.1f} at the start, {os.getloadavg()[0]:.1f} after)"
    v = doc["verification"]
    done = [r for r in v["ranking"] if r["status"] == "completed"]
    assert len(done) == 3 and v["measured_best_index"] in (0, 1, 2)
    assert sorted(r["planner_rank"] for r in v["ranking"]) == [1, 2, 3]
    # the LR check at the base batch (16 = lr_scaling's base_batch_size): every rule gives optim.lr 3e-3, so
    # the check varies the base LR: 3e-3 x 1/2, 1, 2 under rule none, 30 steps each, curves recorded
    check = doc["lr"]["check"]
    assert check["varied"] == "optim.lr" and len(check["runs"]) == 3
    assert sorted(r["lr"] for r in check["runs"]) == pytest.approx([1.5e-3, 3e-3, 6e-3])
    assert all(len(r["curve"]) == 30 and r["lr_rule"] == "none" for r in check["runs"])
    assert doc["lr"]["advice"]["rule"] == "none" and doc["winner"]["command"].endswith("lr_scaling=none optim.lr=0.003")
    assert (tmp_path / "rec" / "recommendation.html").is_file()

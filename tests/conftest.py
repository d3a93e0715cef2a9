"""Shared fixtures. Multi-rank tests start real processes (torchrun + gloo) through the
`scalelab-train` command, exactly as a user would."""
from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
TRAIN = [sys.executable, "-m", "scalelab.train"]
# Small and fast: gpt_nano, short runs, no progress bars, shared data cache.
FAST = ["model=gpt_nano", "trainer.enable_progress_bar=false", "trainer.warmup_steps=2"]


def env() -> dict:
    e = dict(os.environ)
    e.setdefault("SCALELAB_CACHE", str(REPO / ".cache" / "scalelab"))
    e["HYDRA_FULL_ERROR"] = "1"
    return e


def train(args: list[str], cwd: Path, timeout: float = 600, check: bool = True) -> subprocess.CompletedProcess:
    proc = subprocess.run(TRAIN + args, cwd=cwd, env=env(), capture_output=True, text=True, timeout=timeout)
    if check and proc.returncode != 0:
        raise AssertionError(f"scalelab-train {' '.join(args)} exited {proc.returncode}\n"
                             f"--- stdout\n{proc.stdout[-4000:]}\n--- stderr\n{proc.stderr[-4000:]}")
    return proc


def records(root: Path) -> list[dict]:
    return [json.loads(p.read_text()) for p in sorted(root.rglob("run.json"))]


def worker_pids(under: Path | str = "") -> list[int]:
    """Processes still running a scalelab rank of a job under `under` (all ranks if empty)."""
    pids = []
    for d in Path("/proc").iterdir():
        if d.name.isdigit():
            try:
                cmd = (d / "cmdline").read_bytes().replace(b"\0", b" ")
            except OSError:
                continue
            if b"-m scalelab.worker" in cmd and str(under).encode() in cmd:
                pids.append(int(d.name))
    return pids


@pytest.fixture(scope="session")
def core_sweep(tmp_path_factory) -> Path:
    """One real multirun shared by several checks: single/ddp x 1/2 ranks, 20 steps, W&B offline."""
    cwd = tmp_path_factory.mktemp("core_sweep")
    sweep = cwd / "sweep"
    train(["-m", "strategy=single,ddp", "trainer.devices=1,2", "trainer.max_steps=20", "logger=wandb",
           f"hydra.sweep.dir={sweep}", *FAST], cwd)
    return sweep


def by_strategy(recs: list[dict], strategy: str, world: int) -> dict:
    return next(r for r in recs if r["strategy"] == strategy and r["world_size"] == world)


def losses_by_step(rec: dict) -> dict[int, float]:
    return {int(s): v for s, v in rec["loss"]["curve"]}


def assert_same_curve(rec: dict, ref: dict, steps, rel: float) -> None:
    """rec's loss at each of `steps` equals ref's within rel (relative), and it has no other steps."""
    got, want = losses_by_step(rec), losses_by_step(ref)
    assert sorted(got) == list(steps), sorted(got)
    for s in steps:
        assert abs(got[s] - want[s]) <= rel * abs(want[s]), (s, got[s], want[s])


@pytest.fixture(scope="session")
def ref(core_sweep) -> dict:
    """The strategies' references from the core sweep: single@1 and ddp@2 (same global batch)."""
    recs = records(core_sweep)
    return {"single": by_strategy(recs, "single", 1), "ddp": by_strategy(recs, "ddp", 2)}


def run_one_job(tmp_path_factory, tag: str, args: list[str]) -> Path:
    """One fast single run (gpt_nano, no logger) in its own folder; returns its job dir."""
    cwd = tmp_path_factory.mktemp(tag)
    job = cwd / "job"
    train([*FAST, "logger=none", *args, f"hydra.run.dir={job}"], cwd)
    return job


def read_record(job: Path) -> dict:
    return json.loads((job / "run.json").read_text())

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

"""Shared fixtures. Multi-rank tests start real processes (torchrun + gloo) through the
`scalelab-train` command, exactly as a user would."""
from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
TRAIN = [sys.executable, "-m", "scalelab.train"]
# The optimizer of every equivalence run (the references single@1 / ddp@2 included): SGD with
# momentum, no weight decay. Its update is linear in the gradient, so a gradient off by a constant
# factor (ranks' gradients summed instead of averaged, a comm hook without its 1/world division,
# a pipeline loss not divided by the micro-batch count) changes the loss curve; AdamW's update is
# invariant to that factor and would hide it (tests/mutations.py: the broken strategies the tests
# must tell apart). Momentum rather than plain SGD: still linear in the gradient, and it leaves
# optimizer state (one buffer per parameter) for the sharding, checkpoint-resume and planner
# checks to measure. gpt_nano at lr 0.1 falls from 5.54 to ~3.57 in 10 steps (measured).
# Tests that need Adam (ZeRO-Offload's DeepSpeedCPUAdam) run with ADAMW instead (run_one_job's
# `optim`) and compare with the `adamw_single` fixture.
SGD = ["optim=sgd", "optim.lr=0.1", "optim.optimizer.momentum=0.9", "optim.optimizer.weight_decay=0.0"]
ADAMW = ["optim=adamw", "optim.lr=3.0e-3"]
# Small and fast: gpt_nano, short runs, no progress bars, shared data cache.
BASE = ["model=gpt_nano", "trainer.enable_progress_bar=false", "trainer.warmup_steps=2"]
FAST = [*BASE, *SGD]
# gpt_nano's model FLOPs per sample, by hand (scalelab.scaling.mfu's formula 6N + 12 L T d per
# token, N = non-embedding parameters): per layer 4 x 64 x 64 (attention) + 2 x 64 x 256 (MLP)
# + 2 x 2 x 64 (LayerNorms) = 49,408; N = 2 x 49,408 + 128 (final LN) + 256 x 64 (lm_head) =
# 115,328; 6N = 691,968; 12 x 2 x 64 x 64 = 98,304; 790,272 per token x 64 tokens.
NANO_FLOPS_PER_SAMPLE = 50_577_408


def torchrun_probe(script: Path, nproc: int, out: Path, *args: str) -> list[dict]:
    """Run a probe script (not a test module: it writes out/rank{r}.json per rank) on `nproc`
    gloo ranks with torchrun, and return the ranks' JSON in rank order."""
    e = env()
    e["OMP_NUM_THREADS"] = "1"
    for k in ("LOCAL_RANK", "RANK", "WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT"):
        e.pop(k, None)
    proc = subprocess.run([sys.executable, "-m", "torch.distributed.run", "--standalone", f"--nproc_per_node={nproc}",
                           str(script), str(out), *args], env=e, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-4000:]
    return [json.loads((out / f"rank{r}.json").read_text()) for r in range(nproc)]


def env() -> dict:
    e = dict(os.environ)
    e.setdefault("SCALELAB_CACHE", str(REPO / ".cache" / "scalelab"))
    # the torchrun probes' DeepSpeed ops in the jobs' folder (launch.rank_env): built once, not again
    # into ~/.cache by a probe (torch's file lock keeps two builders apart)
    e.setdefault("TORCH_EXTENSIONS_DIR", str(Path(e["SCALELAB_CACHE"]) / "torch_extensions"))
    e["HYDRA_FULL_ERROR"] = "1"
    # A test that used W&B in this pytest process (tests/unit/test_report_wandb.py logs a sweep
    # summary in-process) left its service's address in WANDB_SERVICE: a job started from here would
    # log through that service, not one of its own as a user's job does.
    e.pop("WANDB_SERVICE", None)
    # `make test` sets them: a job's Ctrl-C line then names the make-free command (run_end._under_make)
    e.pop("MAKELEVEL", None)
    e.pop("MAKEFLAGS", None)
    # tests.mutations (strategy._target_=tests.mutations.X) must import in the Hydra app and the ranks
    e["PYTHONPATH"] = os.pathsep.join(p for p in (str(REPO), e.get("PYTHONPATH", "")) if p)
    return e


def train(args: list[str], cwd: Path, timeout: float = 600, check: bool = True) -> subprocess.CompletedProcess:
    proc = subprocess.run(TRAIN + args, cwd=cwd, env=env(), capture_output=True, text=True, timeout=timeout)
    if check and proc.returncode != 0:
        raise AssertionError(f"scalelab-train {' '.join(args)} exited {proc.returncode}\n"
                             f"--- stdout\n{proc.stdout[-4000:]}\n--- stderr\n{proc.stderr[-4000:]}")
    return proc


def records(root: Path) -> list[dict]:
    return [json.loads(p.read_text()) for p in sorted(root.rglob("run.json"))]


def cmdlines():
    """(pid, argv: its /proc cmdline split at NULs) of every process that can be read now."""
    for d in Path("/proc").iterdir():
        if d.name.isdigit():
            try:
                yield int(d.name), (d / "cmdline").read_bytes().split(b"\0")
            except OSError:
                continue


def worker_pids(under: Path | str, rank: int | None = None) -> list[int]:
    """Processes still running a scalelab rank (or only rank `rank`: its process title) of a job
    under `under` (the test's own folder: other scalelab jobs may run on the same machine)."""
    if not str(under) or Path(under) in (Path("/"), Path(".")):
        raise ValueError(f"worker_pids needs the test's own job folder, got {under!r}")
    pids = []
    for pid, argv in cmdlines():
        cmd = b" ".join(argv)
        if b"-m scalelab.worker" in cmd and str(under).encode() in cmd and (
                rank is None or f"(rank {rank}".encode() in cmd):
            pids.append(pid)
    return pids


def once_per_session(tmp_path_factory, name: str, make) -> Path:
    """make(folder) runs once per test session, into folder, even when pytest-xdist splits the
    session over worker processes (`make test` runs two): the first worker to get here runs it
    under a file lock, in the session's base folder (each worker's is popen-gwN inside it); the
    others wait and reuse the folder. A make that failed marks it so: the other workers fail at
    once with its error instead of running it again."""
    import filelock

    base = tmp_path_factory.getbasetemp()
    run = os.environ.get("PYTEST_XDIST_TESTRUNUID")
    if os.environ.get("PYTEST_XDIST_WORKER") is None or not run or not base.name.startswith("popen-gw"):
        folder = tmp_path_factory.mktemp(name)
        make(folder)
        return folder
    shared = base.parent / f"{name}-{run}"     # this run's id: nothing from another session is reused
    done, failed = shared.with_suffix(".done"), shared.with_suffix(".failed")
    with filelock.FileLock(str(shared.with_suffix(".lock"))):
        if failed.exists():
            pytest.fail(f"{name} failed in another worker:\n{failed.read_text()}")
        if not done.exists():
            shutil.rmtree(shared, ignore_errors=True)
            shared.mkdir()
            try:
                make(shared)
            except BaseException as e:
                failed.write_text(str(e)[-4000:] or type(e).__name__)
                raise
            done.touch()
    return shared


@pytest.fixture(scope="session")
def core_sweep(tmp_path_factory) -> Path:
    """One real multirun shared by several checks: single/ddp x 1/2 ranks, 20 steps, W&B offline."""
    def make(cwd: Path) -> None:
        train(["-m", "strategy=single,ddp", "trainer.devices=1,2", "trainer.max_steps=20", "logger=wandb",
               f"hydra.sweep.dir={cwd / 'sweep'}", *FAST], cwd)

    return once_per_session(tmp_path_factory, "core_sweep", make) / "sweep"


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


def assert_nano_flops(rec: dict) -> None:
    """The run's model FLOPs per sample are gpt_nano's whole model's, whatever this rank holds."""
    assert rec["mfu"]["model_flops_per_sample"] == NANO_FLOPS_PER_SAMPLE, rec["mfu"]


def max_rel_diff(rec: dict, ref: dict) -> float:
    """Largest relative difference of rec's loss from ref's over rec's steps."""
    got, want = losses_by_step(rec), losses_by_step(ref)
    return max(abs(got[s] - want[s]) / abs(want[s]) for s in got)


@pytest.fixture(scope="session")
def ref(core_sweep) -> dict:
    """The strategies' references from the core sweep: single@1 and ddp@2 (same global batch, SGD)."""
    recs = records(core_sweep)
    return {"single": by_strategy(recs, "single", 1), "ddp": by_strategy(recs, "ddp", 2)}


@pytest.fixture(scope="session")
def adamw_single(tmp_path_factory) -> dict:
    """single@1 with AdamW, 10 steps: the reference of the tests that need Adam (slow suite only)."""
    def make(cwd: Path) -> None:
        train([*BASE, *ADAMW, "logger=none", "strategy=single", "trainer.devices=1", "trainer.max_steps=10",
               f"hydra.run.dir={cwd / 'job'}"], cwd)

    return read_record(once_per_session(tmp_path_factory, "single_adamw", make) / "job")


def run_one_job(tmp_path_factory, tag: str, args: list[str], optim: list[str] = SGD, timeout: float = 600) -> Path:
    """One fast single run (gpt_nano, no logger) in its own folder; returns its job dir."""
    cwd = tmp_path_factory.mktemp(tag)
    job = cwd / "job"
    train([*BASE, *optim, "logger=none", *args, f"hydra.run.dir={job}"], cwd, timeout=timeout)
    return job


def run_jobs(tmp_path_factory, tag: str, jobs: dict[str, list[str]], optim: list[str] = SGD,
             timeout: float = 600) -> dict[str, Path]:
    """Several fast runs (gpt_nano, no logger) that differ in several keys at once, as ONE multirun,
    the way `scalelab recommend --verify` runs its candidates: each run's overrides become an option
    of a config group written here (a `# @package _global_` overlay), so the command imports the
    worker once for all of them (a sweep job costs about half a lone command: README
    "Performance", sweepcost). Returns each run's job dir (sweep/N, in the order given)."""
    from scalelab.recommend.verify import overlay

    cwd = tmp_path_factory.mktemp(tag)
    group = cwd / "conf" / "test_job"
    group.mkdir(parents=True)
    for name, overrides in jobs.items():
        (group / f"{name}.yaml").write_text(overlay(list(overrides)))
    train(["-m", f"+test_job={','.join(jobs)}", f"hydra.searchpath=[file://{cwd / 'conf'}]",
           f"hydra.sweep.dir={cwd / 'sweep'}", *BASE, *optim, "logger=none"], cwd, timeout=timeout)
    return {name: cwd / "sweep" / str(i) for i, name in enumerate(jobs)}


def read_record(job: Path) -> dict:
    return json.loads((job / "run.json").read_text())


def assert_carries_its_config(ckpt: Path, step: int) -> None:
    """Checkpoint `ckpt` (JOB/checkpoints/NAME, any strategy's format) carries its job's resolved
    config and its step, read without its tensors (scalelab.checkpoint_config: a copy is checked by them)."""
    import yaml

    from scalelab.checkpoint_config import saved_config, saved_step

    job_config = yaml.safe_load((ckpt.parent.parent / "config_resolved.yaml").read_text())
    assert saved_config(ckpt) == job_config and saved_step(ckpt) == step


def seeded_initial_state(rec: dict) -> dict:
    """The job's own initial weights, rebuilt as its worker built them: L.seed_everything(cfg.seed,
    workers=True), then scalelab.models.build.build_net(arch) (LitModule.__init__) from the job's
    model.arch. The test process's RNG state and PL_* environment variables are restored after."""
    import lightning as L
    import torch

    from scalelab.models.gpt import GPTConfig
    from scalelab.models.build import build_net

    arch = {k: v for k, v in rec["config"]["model"]["arch"].items() if k != "_target_"}
    assert rec["config"]["model"]["arch"]["_target_"] == "scalelab.models.gpt.GPTConfig"
    saved_env = {k: os.environ.get(k) for k in ("PL_GLOBAL_SEED", "PL_SEED_WORKERS")}
    import random

    import numpy as np
    py_state, np_state = random.getstate(), np.random.get_state()
    try:
        with torch.random.fork_rng(devices=[]):
            L.seed_everything(rec["config"]["seed"], workers=True, verbose=False)
            net = build_net(GPTConfig(**arch))
    finally:
        random.setstate(py_state)
        np.random.set_state(np_state)
        for k, v in saved_env.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v
    return {k: v.detach().clone() for k, v in net.state_dict().items()}


def assert_trained_from_seeded_init(state: dict, rec: dict) -> None:
    """`state` (an export of job `rec`) holds weights trained from the job's own initial ones.

    - The rebuilt initial weights really are the job's: the control bytes 0x01-0x08 never occur
      in the stdlib corpus (0 of its 31M bytes; NUL does, 1,752 times), so their embedding rows
      get a zero gradient every step and, under SGD without weight decay, keep their initial
      values exactly. A wrong seed or a different build order fails here.
    - Every tensor was trained: none equals its initial value, and each moved by more than 1e-5
      somewhere, far above float32 noise on weights of ~0.02-1 (measured over 10 steps of single:
      the least-moved tensor, layers.1.attn.k_proj.weight, by 2.5e-4). An export of the initial
      weights fails both."""
    import torch

    init = seeded_initial_state(rec)
    assert rec["config"]["optim"]["name"] == "sgd" and rec["config"]["optim"]["optimizer"]["weight_decay"] == 0
    assert set(state) == set(init)
    unseen = slice(1, 9)
    assert torch.equal(state["tok_emb.weight"][unseen], init["tok_emb.weight"][unseen]), "not the job's initial weights"
    for k, v in state.items():
        assert not torch.equal(v, init[k]), f"{k} is still the initial weights"
        assert (v - init[k]).abs().max() > 1e-5, (k, float((v - init[k]).abs().max()))


@pytest.fixture()
def wandb_env(tmp_path, monkeypatch):
    """No credentials anywhere W&B looks (env, ~/.netrc, its config dir); files under tmp_path."""
    monkeypatch.delenv("WANDB_API_KEY", raising=False)
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    for var in ("WANDB_CONFIG_DIR", "WANDB_CACHE_DIR", "WANDB_DATA_DIR", "WANDB_DIR"):
        monkeypatch.setenv(var, str(tmp_path / var.lower()))
    monkeypatch.setenv("WANDB_SILENT", "true")
    monkeypatch.setenv("WANDB_CONSOLE", "off")
    return tmp_path


def run_cli(argv: list[str], capsys) -> tuple[int, object]:
    """`scalelab ARGV` in this process: (exit code, pytest's captured out/err)."""
    from scalelab.cli import main

    with pytest.raises(SystemExit) as done:
        main(argv)
    return done.value.code, capsys.readouterr()

"""SIGTERM outside SLURM saves where the ranks are, and the same command resumes there.

`docker stop`, a pod's eviction or a spot preemption SIGTERM the launcher (the container's PID 1)
and kill it after a grace period (Kubernetes: 30 s by default). Before, only srun's ranks saved on
a signal: elsewhere the launcher passed SIGTERM on and SIGKILLed the ranks 5 s later, losing every
step since the last checkpoint.every_n_steps (with checkpoint.save alone: the whole run). Now a
job that checkpoints has its ranks agree on a step, save a checkpoint there and exit 143 (128 +
SIGTERM: interrupted, resumable); the launcher waits for them (launch.stop_grace_s) and exits 143
too; the same command again in the same folder resumes from that step and ends on the loss of an
uninterrupted run (SGD, the same data order: deterministic; the core sweep's ddp@2 run)."""
from __future__ import annotations

import json
import os
import signal
import subprocess
import time

import pytest

from scalelab.checkpointing import find_resume

from ..conftest import FAST, TRAIN, env, train, worker_pids

pytestmark = pytest.mark.integration
STEPS = 20   # as the core sweep's ddp@2 run (conftest ref["ddp"]), the uninterrupted curve
ARGS = [*FAST, "strategy=ddp", "trainer.devices=2", f"trainer.max_steps={STEPS}", "checkpoint.save=true",
        "logger=none"]


def _progress(job) -> int:
    try:
        return int((job / ".progress").read_text())
    except (OSError, ValueError):
        return -1


def test_sigterm_saves_at_an_agreed_step_and_the_same_command_resumes_there(tmp_path, ref):
    job = tmp_path / "job"
    proc = subprocess.Popen(TRAIN + [*ARGS, f"hydra.run.dir={job}"], cwd=tmp_path, env=env(),
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    deadline = time.monotonic() + 300
    while _progress(job) < 1:                       # training: the ranks have their handlers
        assert proc.poll() is None and time.monotonic() < deadline, proc.communicate()
        time.sleep(0.05)
    os.kill(proc.pid, signal.SIGTERM)
    out, err = proc.communicate(timeout=180)
    assert proc.returncode == 143, err[-3000:]
    saved, step, problems = find_resume(job)
    assert saved is not None and not problems, (problems, out[-2000:], err[-2000:])   # before: no checkpoint at all
    assert 1 <= step < STEPS, step
    # the ranks' SIGTERM is the launcher's forwarding of any stop (a Ctrl-C's read "SIGTERM: ..."): unnamed
    assert f"[scalelab] checkpoint {saved} saved at step {step}; stopping (the same command in the same " \
           "folder goes on from it)" in out and "SIGTERM: checkpoint" not in out, out[-3000:]
    assert f"[scalelab] interrupted (SIGTERM) in {job}: the same command with hydra.run.dir={job} goes on from its " \
           f"checkpoint {saved.name}" in err, err[-3000:]
    assert "Traceback" not in err and not worker_pids(tmp_path)
    # its record says how far it got (none was written: a stopped sweep job was missing from compare)
    stopped = json.loads((job / "run.json").read_text())
    assert (stopped["status"], stopped["returncode"], stopped["error"], stopped["steps"]) == \
        ("failed", 143, "stopped by SIGTERM", step)
    assert [s for s, _ in stopped["loss"]["curve"]] == list(range(1, step + 1))

    train([*ARGS, f"hydra.run.dir={job}"], tmp_path)   # the same command again
    rec = json.loads((job / "run.json").read_text())
    assert rec["status"] == "completed" and rec["resumed_at_step"] == step and rec["steps"] == STEPS
    assert [s for s, _ in rec["loss"]["curve"]] == list(range(1, STEPS + 1))   # the whole run's curve

    want = ref["ddp"]["loss"]   # the same job uninterrupted (its logger and checkpointing aside)
    assert rec["loss"]["final"] == pytest.approx(want["final"], rel=1e-6), (rec["loss"]["final"], want["final"])
    assert [v for _, v in rec["loss"]["curve"]] == pytest.approx([v for _, v in want["curve"]], rel=1e-6)


# -- the launcher's side, without ranks: how long it waits, and for what ---------------------------
def _job_dir(tmp_path, checkpoint: dict):
    import yaml

    (tmp_path / "config_resolved.yaml").write_text(yaml.safe_dump({"checkpoint": checkpoint}))
    return tmp_path


@pytest.mark.parametrize("checkpoint,grace", [({"every_n_steps": 5}, 60.0), ({"save": True}, 60.0),
                                              ({"save": False, "every_n_steps": None}, 5.0),
                                              ({"save": True, "stop_grace_s": 150}, 150.0)])
def test_the_grace_is_the_save_s_where_the_job_checkpoints(tmp_path, checkpoint, grace):
    from scalelab.launch import stop_grace_s

    assert stop_grace_s(_job_dir(tmp_path, checkpoint)) == grace
    assert stop_grace_s(tmp_path / "no-such-job") == 5.0


def _rank(behaviour: str) -> None:
    """A stand-in rank (its session's leader, as spawn's): on SIGTERM it saves for 1 s and exits 143
    ('saves'), ignores it ('hangs') or dies of it ('dies')."""
    os.setsid()
    devnull = os.open(os.devnull, os.O_WRONLY)   # not the test's output: a stray one would hold it open
    os.dup2(devnull, 1)
    os.dup2(devnull, 2)
    if behaviour == "saves":
        signal.signal(signal.SIGTERM, lambda *a: (time.sleep(1.0), os._exit(143)))
    elif behaviour == "hangs":
        signal.signal(signal.SIGTERM, signal.SIG_IGN)
    while True:
        time.sleep(0.05)


@pytest.fixture
def ranks():
    """start(*behaviours) -> stand-in ranks; any left running at the end are killed."""
    import multiprocessing as mp

    started = []

    def start(*behaviours):
        procs = [mp.get_context("fork").Process(target=_rank, args=(b,), daemon=True) for b in behaviours]
        for p in procs:
            p.start()
        started.extend(procs)
        time.sleep(0.5)   # their handlers are set
        return procs

    yield start
    for p in started:
        if p.exitcode is None:
            os.kill(p.pid, signal.SIGKILL)
            p.join(5)


def test_the_ranks_get_the_grace_together_and_what_hangs_is_killed_after_it(ranks):
    from scalelab import spawn

    procs = ranks("saves", "saves")
    t0 = time.monotonic()
    spawn._stop(procs, grace=20.0)
    assert [p.exitcode for p in procs] == [143, 143] and time.monotonic() - t0 < 10   # not one grace per rank
    procs = ranks("saves", "hangs")
    t0 = time.monotonic()
    spawn._stop(procs, grace=3.0)
    took = time.monotonic() - t0
    assert procs[0].exitcode == 143 and procs[1].exitcode == -signal.SIGKILL and 3.0 <= took < 10, took


def test_a_rank_that_dies_instead_of_saving_ends_the_wait(ranks):
    """Its peers cannot save without it (a Ctrl-C while ranks start): no grace to wait out."""
    from scalelab import spawn

    procs = ranks("dies", "hangs")
    t0 = time.monotonic()
    spawn._stop(procs, grace=30.0)
    assert procs[0].exitcode == -signal.SIGTERM and procs[1].exitcode == -signal.SIGKILL
    assert time.monotonic() - t0 < 10

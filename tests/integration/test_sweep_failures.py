"""A job whose rank is killed mid-sweep (SIGKILL, as the OOM killer would; SIGTERM, as an operator
or another launcher would) is recorded as failed, naming that rank; the other jobs complete;
aggregation reports it; the command exits 1 and leaves no rank behind.

SIGTERM: Lightning's own handler broadcast a flag from the signal handler, out of step with the
peers' per-batch broadcast, and both ranks hung until the collective timeout (measured: still
there 55 s later, no CPU time); the rank then exited 0 (SIGTERMException is a SystemExit), so its
peer was named. Now it stops after its batch and ends by the signal (requeue.rank_local_sigterm,
end_by_sigterm)."""
import json
import os
import re
import signal
import subprocess
import threading
import time
from pathlib import Path

import pytest

from ..conftest import FAST, TRAIN, env, records, train, worker_pids

pytestmark = pytest.mark.integration


# Job 0 is long (LONG steps: minutes on this machine, well over 10 s on any CPU) so that it is
# still running whenever the watcher kills it, however fast the host; job 1 is short.
LONG, SHORT = 5000, 20


def _kill_rank_when_training(job_dir: Path, stop: threading.Event, killed: list, sig: int) -> None:
    """Kill one rank of the job in `job_dir` once it is seen training: its CSV logger has flushed
    metrics (Lightning's CSVLogger writes csv/metrics.csv every 100 steps) and its rank processes
    still run."""
    metrics = job_dir / "csv" / "metrics.csv"
    while not stop.is_set():
        if metrics.exists():
            pids = worker_pids(job_dir)
            if pids:  # still running: kill one rank
                os.kill(max(pids), sig)
                killed.append(max(pids))
                return
        time.sleep(0.1)


# SIGKILL with -m slow: the failed job, the sweep going on and the signal named are the same path
# as SIGTERM's here; a rank killed by signal 9 is named in test_elastic's killed-rank test too
@pytest.mark.parametrize("sig", [pytest.param(signal.SIGKILL, marks=pytest.mark.slow, id="SIGKILL"),
                                 pytest.param(signal.SIGTERM, id="SIGTERM")])
def test_killed_rank_fails_its_job_not_the_sweep(tmp_path, sig):
    sweep = tmp_path / "sweep"
    stop, killed = threading.Event(), []
    watcher = threading.Thread(target=_kill_rank_when_training, args=(sweep / "0", stop, killed, sig), daemon=True)
    watcher.start()
    proc = subprocess.run(TRAIN + ["-m", "strategy=ddp", "trainer.devices=2", f"trainer.max_steps={LONG},{SHORT}",
                                   "logger=csv", "trainer.collective_timeout_s=120", f"hydra.sweep.dir={sweep}", *FAST],
                          cwd=tmp_path, env=env(), capture_output=True, text=True, timeout=900)
    stop.set()
    assert killed, f"the watcher never found job 0's ranks\n{proc.stdout[-3000:]}\n{proc.stderr[-3000:]}"
    recs = {r["job"]["num"]: r for r in records(sweep)}
    assert sorted(recs) == [0, 1]
    assert recs[1]["status"] == "completed"     # the job after the failed one still ran
    assert recs[0]["config"]["trainer"]["max_steps"] == LONG and recs[1]["steps"] == SHORT
    assert recs[0]["status"] == "failed" and recs[0]["error"]
    # the first failure is named, not its peers' "connection closed" that followed it
    assert f"failed first (killed by signal {int(sig)})" in recs[0]["error"], recs[0]["error"]
    assert recs[0]["world_size"] == 2 and recs[0]["strategy"] == "ddp"  # what was known before the crash
    summary = json.loads((sweep / "sweep.json").read_text())
    assert summary["num_failed"] == 1 and summary["failed"][0]["job"] == recs[0]["job"]["name"]
    assert proc.returncode == 1 and "1 job(s) failed" in proc.stderr
    assert "FAILED" in proc.stdout
    assert worker_pids(sweep) == []


# torchrun_local (15 s) in the slow suite: its error-file choice is tests/unit/test_cause_rank.py's
@pytest.mark.parametrize("launcher", ["local", pytest.param("torchrun_local", marks=pytest.mark.slow)])
def test_the_rank_that_raised_is_named_not_the_peer_that_lost_it(tmp_path, launcher):
    """Rank 1 raises at step 3 (tests/slurm/crash.py CrashingDDP); rank 0 then fails on gloo's
    'Connection reset/closed by peer'. Both exit 1 at once, and the job's error named rank 0 (the
    fork server reports the lowest rank first; torchrun's error files were read in name order):
    the user read a transport error and not the cause. The console shows each exception line,
    not the ~180 traceback lines (ranks.log keeps them)."""
    job = tmp_path / "job"
    cmd = [*FAST, "strategy=ddp", "strategy._target_=tests.slurm.crash.CrashingDDP", "trainer.devices=2",
           "trainer.max_steps=8", "checkpoint.every_n_steps=2", "logger=none", f"launcher={launcher}",
           f"hydra.run.dir={job}"]
    proc = train(cmd, tmp_path, check=False)
    rec = json.loads((job / "run.json").read_text())
    assert proc.returncode == 1 and rec["status"] == "failed"
    assert "injected rank crash at step 3" in rec["error"] and "rank1" in rec["error"].replace(" ", ""), rec["error"]
    assert "by peer" in (job / "error-rank0.txt").read_text()   # the consequence the error used to name
    assert "Traceback" not in proc.stdout + proc.stderr and "traceback line(s) not shown here" in proc.stdout
    assert "Traceback" in (job / "ranks.log").read_text()
    # the exception is on a line of its own, not after rank 0's progress bar
    assert any(re.match(r"(\[rank1\]: )?RuntimeError: injected rank crash at step 3", line)
               for line in proc.stdout.splitlines()), proc.stdout[-3000:]
    assert rec["resumed_at_step"] is None and "steps_this_attempt" not in rec and rec["slurm"] is None
    # The same command again resumes from step 2 and fails at step 3 once more: its failed record
    # says where this attempt started, as a completed one would (a failed SLURM requeue said nothing)
    proc = train(cmd, tmp_path, check=False)
    rec = json.loads((job / "run.json").read_text())
    assert proc.returncode == 1 and "injected rank crash at step 3" in rec["error"], rec["error"]
    assert (rec["resumed_at_step"], rec["steps"], rec["steps_this_attempt"]) == (2, 3, 1)


def test_a_failed_job_s_wandb_run_has_its_steps_and_ends_failed(tmp_path):
    """Rank 0's W&B run of a job whose rank raised: a forked rank ends by os._exit, past W&B's
    atexit hook, so the offline run was its 7-byte header alone (no config, history or exit), and
    `wandb sync` refused it ('transactionlog: error getting next record: EOF')."""
    from scalelab.results.wandb_offline import find_runs, read_run

    job = tmp_path / "job"
    proc = train([*FAST, "strategy=ddp", "strategy._target_=tests.slurm.crash.CrashingDDP", "trainer.devices=2",
                  "trainer.max_steps=8", "logger=wandb", f"hydra.run.dir={job}"], tmp_path, check=False)
    assert proc.returncode == 1, proc.stdout[-2000:]
    runs = find_runs(job)
    # one W&B run: rank 0's, and the launcher's continuation of it that puts the error in its summary
    assert len(runs) == 2 and len({p.name for p in runs}) == 1, runs
    run, marked = (read_run(p) for p in runs)
    assert run["exit_code"] == 1 and run["config"].get("world_size") == 2, run["config"]
    steps = sorted({h["trainer/global_step"] for h in run["history"] if "train/loss" in h})
    assert steps[:3] == [0, 1, 2], steps                         # rank 1 raised in step 3
    assert marked["exit_code"] == 1 and marked["summary"]["status"] == "failed", marked
    assert "injected rank crash at step 3" in marked["summary"]["error"], marked["summary"]

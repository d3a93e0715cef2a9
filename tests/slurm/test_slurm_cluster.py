"""SLURM for real: these tests submit to the local cluster of scripts/slurm_cluster.sh (slurmctld,
slurmd, slurmdbd + MariaDB) and read its accounting (sacct). No mock: without a cluster they skip
with the script's own reason; under CI (.ci/run sets SCALELAB_SLURM_REQUIRED=1 after `up`) a
cluster that is down fails them instead.

The sweep's first job (2-rank ddp via `hydra/launcher=slurm`) is also the uninterrupted run the
requeued `scalelab slurm submit --wait` job must match: SGD, no dropout, data order restored from the step (sampler), so the
final loss is reproducible to the bit."""
from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import time
from pathlib import Path

import pytest

from ..conftest import FAST, REPO, TRAIN, env

pytestmark = pytest.mark.integration
_status = subprocess.run(["bash", str(REPO / "scripts" / "slurm_cluster.sh"), "status"], capture_output=True,
                         text=True)
if _status.returncode != 0:
    _why = (_status.stdout or _status.stderr).strip()
    if os.environ.get("SCALELAB_SLURM_REQUIRED") == "1" and _status.returncode != 2:
        raise RuntimeError(f"SLURM tests required (SCALELAB_SLURM_REQUIRED=1) but the cluster is {_why}")
    pytest.skip(f"no SLURM cluster: {_why}", allow_module_level=True)

SLURM = [sys.executable, "-m", "scalelab.cli", "slurm"]
# 100 steps, a checkpoint every 10: long enough to be interrupted twice (~4 s of steps).
RUN = [*FAST, "strategy=ddp", "trainer.devices=2", "trainer.max_steps=100", "checkpoint.every_n_steps=10"]
SUBMIT = ["submit", "--wait", "--cpu", "--cpus-per-task", "1", "--time", "00:10:00"]
HOSTILE = "+note='a b; touch PWN1 $(touch PWN2) `touch PWN3` \"q\" && touch PWN4'"


def sacct_state(job_id: str) -> str:
    out = subprocess.run(["sacct", "-n", "-P", "-X", "-o", "JobID,State", "-j", job_id.split("_")[0]],
                         capture_output=True, text=True).stdout
    return dict(line.split("|", 1) for line in out.splitlines())[job_id]


def start_submit(args: list[str], cwd: Path) -> tuple[subprocess.Popen, Path, str, Path]:
    """`scalelab slurm submit --wait ...` in the background; (process, log, job id, run dir)."""
    log = cwd / "submit.log"
    proc = subprocess.Popen([*SLURM, *SUBMIT, *args], cwd=cwd, env=env(), stdout=open(log, "w"),
                            stderr=subprocess.STDOUT, text=True)
    deadline = time.monotonic() + 60
    while not (m := re.search(r"Submitted batch job (\d+): 1 run\(s\) under (\S+)", log.read_text())):
        assert proc.poll() is None and time.monotonic() < deadline, log.read_text()
        time.sleep(0.1)
    return proc, log, m.group(1), Path(m.group(2))


def wait_for_step(job_dir: Path, step: int, timeout: float = 120) -> int:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            now = int((job_dir / ".progress").read_text())
        except (OSError, ValueError):
            now = -1
        if now >= step:
            return now
        time.sleep(0.05)
    raise AssertionError(f"{job_dir} never reached step {step}")


def finish(proc: subprocess.Popen, log: Path, timeout: float = 240) -> str:
    proc.wait(timeout=timeout)
    text = log.read_text()
    assert proc.returncode == 0, text[-4000:]
    return text


@pytest.fixture(scope="module")
def jobs(tmp_path_factory) -> dict:
    """Everything the cluster runs, submitted at once so the jobs overlap (the test node has 2 slots
    per core; the jobs are mostly start-up): a 2-job sweep through `hydra/launcher=slurm` (job 0:
    2-rank ddp, uninterrupted: the run the requeued job must match; job 1: the same with a rank
    that crashes at step 3), and a `scalelab slurm submit --wait` 2-rank ddp job interrupted twice:
    the warning signal (USR1 to the batch step: it saves and requeues itself), then `scontrol
    requeue` (SIGTERM to every process: the ranks save if they can, SLURM requeues)."""
    cwd = tmp_path_factory.mktemp("slurm")
    out = cwd / "sweep"
    sweep = subprocess.Popen([*TRAIN, "-m", "hydra/launcher=slurm", "hydra.launcher.cpus_per_task=1",
                              "trainer.accelerator=cpu", *RUN, "logger=none", HOSTILE,
                              "strategy._target_=scalelab.strategies.ddp.DDP,tests.slurm.crash.CrashingDDP",
                              f"hydra.sweep.dir={out}"], cwd=cwd, env=env(), stdout=subprocess.PIPE,
                             stderr=subprocess.PIPE, text=True)
    sub = cwd / "submit"
    sub.mkdir()
    proc, log, job, run_dir = start_submit([*RUN, "strategy._target_=tests.slurm.crash.SlowDDP", "logger=wandb",
                                            "logger.mode=offline", HOSTILE], sub)
    at = wait_for_step(run_dir, 20, timeout=180)
    subprocess.run(["scancel", "--signal=USR1", "--batch", job], check=True, capture_output=True)
    deadline = time.monotonic() + 180
    while "resuming from" not in (run_dir / "ranks.log").read_text():   # the requeued attempt started
        assert time.monotonic() < deadline and proc.poll() is None, log.read_text()[-3000:]
        time.sleep(0.1)
    first_resume = int(re.findall(r"resuming from \S+ \(step (\d+)\)", (run_dir / "ranks.log").read_text())[0])
    wait_for_step(run_dir, first_resume + 15, timeout=180)
    subprocess.run(["scontrol", "requeue", job], check=True, capture_output=True)
    text = finish(proc, log)
    # requeued once more after it finished (as a preemption between the last step and the exit
    # does): the third requeue must keep the record and run nothing
    record = (run_dir / "run.json").read_text()
    subprocess.run(["scontrol", "requeue", job], check=True, capture_output=True)
    stdout, stderr = sweep.communicate(timeout=240)
    deadline = time.monotonic() + 120
    while not ("record is kept" in (run_dir / "ranks.log").read_text() and sacct_state(job) == "COMPLETED"):
        assert time.monotonic() < deadline, (run_dir / "ranks.log").read_text()[-3000:]
        time.sleep(0.2)
    again = (record, (run_dir / "run.json").read_text(), (run_dir / "ranks.log").read_text())
    return {"sweep": (sweep.returncode, stdout, stderr, out), "submit": (text, job, run_dir, at, first_resume, sub),
            "again": again}


def test_sweep_on_slurm_records_a_crashed_job_and_finishes_the_others(jobs):
    rc, stdout, stderr, out = jobs["sweep"]
    assert rc == 1, stdout[-3000:] + stderr[-3000:]
    good, bad = (json.loads((out / n / "run.json").read_text()) for n in ("0", "1"))
    assert good["status"] == "completed" and good["world_size"] == 2 and good["steps"] == 100
    assert good["slurm"]["state"] == "COMPLETED" and sacct_state(good["slurm"]["job_id"]) == "COMPLETED"
    assert good["job"]["name"] == "sweep/0" and [p["rank"] for p in good["placement"]] == [0, 1]
    assert bad["status"] == "failed" and bad["slurm"]["state"] == "FAILED"
    assert bad["slurm"]["reason"].startswith("NonZeroExitCode") and "injected rank crash at step 3" in bad["error"]
    assert sacct_state(bad["slurm"]["job_id"]) == "FAILED"
    # its .out reads as the local console does: the exception line, not ~190 traceback lines
    dot_out = next(p for p in (out / "slurm").glob("*.out") if bad["slurm"]["job_id"] in p.name).read_text()
    assert "RuntimeError: injected rank crash at step 3" in dot_out and "Traceback" not in dot_out, dot_out[-3000:]
    assert "traceback line(s) not shown here" in dot_out and "Traceback" in (out / "1" / "ranks.log").read_text()
    summary = json.loads((out / "sweep.json").read_text())
    assert summary["num_completed"] == 1 and summary["num_failed"] == 1
    assert "== sweep" in stdout and "1 job(s) failed" in stderr and "SLURM job" in stderr


def test_submit_wait_requeued_twice_resumes_by_itself_and_ends_like_the_uninterrupted_run(jobs):
    """Each attempt resumes from the newest checkpoint with no flag from the user, and the run
    ends as the sweep's uninterrupted job 0 did. A hostile override value goes through sbatch,
    bash and srun as one literal string."""
    text, job, run_dir, at, first_resume, cwd = jobs["submit"]
    # saved at the signal, not at the last periodic checkpoint (every 10 steps): its own line says
    # so, within a few steps of it (SlowDDP's steps are >= 50 ms; a loaded machine delays the
    # signal's path through slurmd to the ranks by a few hundred ms)
    assert at <= first_resume < at + 40
    assert re.search(rf"SIGUSR1: checkpoint \S+ saved at step {first_resume};", (run_dir / "ranks.log").read_text())
    rec = json.loads((run_dir / "run.json").read_text())
    ref = json.loads((jobs["sweep"][3] / "0" / "run.json").read_text())
    assert rec["status"] == "completed" and rec["world_size"] == 2 and sacct_state(job) == "COMPLETED"
    assert rec["slurm"]["job_id"] == job and rec["slurm"]["requeues"] == 2 and rec["slurm"]["node_list"]
    assert rec["steps"] == ref["steps"] == 100 and first_resume < rec["resumed_at_step"] < 100
    assert rec["loss"]["final"] == ref["loss"]["final"], (rec["loss"]["final"], ref["loss"]["final"])
    # the whole curve across the three attempts (each checkpoint keeps the ranks' curve so far)
    assert rec["loss"]["curve"] == ref["loss"]["curve"]
    assert "loss final" in text and f"SLURM job {job}: COMPLETED" in text   # the comparison table
    # every attempt logged to the same W&B run (resume by id): one id, no second run
    runs = sorted(p.name for p in (run_dir / "wandb").glob("offline-run-*"))
    assert len(runs) == 3 and {r.rsplit("-", 1)[1] for r in runs} == {(run_dir / ".wandb_run_id").read_text().strip()}
    # the injection test, through sbatch itself: nothing ran, the value arrived whole
    assert rec["config"]["note"] == "a b; touch PWN1 $(touch PWN2) `touch PWN3` \"q\" && touch PWN4"
    assert not list(cwd.parent.rglob("PWN*"))


def test_a_finished_job_requeued_again_keeps_its_record_and_runs_nothing(jobs):
    before, after, ranks_log = jobs["again"]
    assert after == before
    last = ranks_log[ranks_log.rindex("SLURM attempt: job"):]
    assert "requeue 3: the run completed in requeue 2; its record is kept" in last
    assert "resuming from" not in last and "step" not in last.split("\n", 1)[1]   # no rank started


def test_bad_override_fails_before_anything_is_submitted(tmp_path):
    name = f"bad{os.getpid()}"
    for cmd in ([*SLURM, *SUBMIT, "--job-name", name, "trainer.devices=2", "trainer.max_steps=abc"],
                [*TRAIN, "-m", "hydra/launcher=slurm", f"hydra.launcher.job_name={name}",
                 "trainer.max_steps=10,abc", f"hydra.sweep.dir={tmp_path / 'sweep'}"]):
        proc = subprocess.run(cmd, cwd=tmp_path, env=env(), capture_output=True, text=True, timeout=120)
        assert proc.returncode == 2 and proc.stderr.count("\n") == 1, proc.stderr
        assert "abc" in proc.stderr and "Traceback" not in proc.stderr
    assert not list(tmp_path.rglob("*.sbatch"))
    assert not (tmp_path / "sweep").exists()     # a refused sweep leaves no multirun.yaml-only folder
    out = subprocess.run(["sacct", "-n", "-X", "-S", "now-1hours", f"--name={name}"], capture_output=True, text=True)
    assert out.stdout.strip() == ""


def test_a_job_slurm_could_never_start_is_refused_before_anything_is_submitted(tmp_path):
    """More ranks x CPUs than a node has, more nodes than the cluster has, a partition it does not
    have: SLURM used to accept such a job and leave it PENDING (PartitionConfig) for good while
    `--wait` said nothing. `sbatch --test-only` asks the scheduler first: one line, exit 2, no job,
    no script kept. A sweep is checked whole before its first job is submitted."""
    name = f"never{os.getpid()}"
    info = subprocess.run(["sinfo", "-h", "-o", "%P|%D|%c"], capture_output=True, text=True).stdout.split()
    part, nodes, cpus = info[0].split("|")
    part, nodes, cpus = part.rstrip("*"), int(nodes), int(cpus.rstrip("+"))
    batch = f"data.global_batch_size={4 * cpus}"    # divides by 1 and by 2 x cpus ranks
    ok = ["submit", "--cpu", "--cpus-per-task", "1", "--time", "00:10:00", "--job-name", name, *FAST, batch]
    for cmd in ([*SLURM, *ok, "--devices", str(2 * cpus)],
                [*SLURM, *ok, "--nodes", str(nodes + 1)],
                [*SLURM, *ok, "--partition", "nosuchpart"],
                [*TRAIN, "-m", "hydra/launcher=slurm", f"hydra.launcher.job_name={name}", "trainer.accelerator=cpu",
                 *FAST, batch, f"trainer.devices=1,{2 * cpus}", f"hydra.sweep.dir={tmp_path / 'sweep'}"]):
        try:
            proc = subprocess.run(cmd, cwd=tmp_path, env=env(), capture_output=True, text=True, timeout=60)
        finally:   # a job that got through would wait in the queue for good
            subprocess.run(["scancel", f"--name={name}"], capture_output=True)
        assert proc.returncode == 2 and proc.stderr.count("\n") == 1, proc.stderr
        assert proc.stderr.startswith("error: SLURM would never start this job") and "Traceback" not in proc.stderr
        assert f"partitions here: {part}" in proc.stderr and "nothing was submitted" in proc.stderr, proc.stderr
    assert not list(tmp_path.rglob("*.sbatch")) and not (tmp_path / "sweep").exists()
    out = subprocess.run(["sacct", "-n", "-X", "-S", "now-1hours", f"--name={name}"], capture_output=True, text=True)
    assert out.stdout.strip() == ""


def test_an_array_job_is_a_sweep_with_its_w_and_b_summary(tmp_path):
    """`--array` once per override set: one SLURM array task per set, each in its own run dir, and
    `--wait` aggregates them as a local sweep: sweep.json, the comparison, the dashboard and, with
    the tasks' logger (W&B offline by default), the sweep's W&B summary run (it was not logged)."""
    name = f"array{os.getpid()}"
    # a site's SBATCH_* defaults (profile.d) overrode the script's checked options: sbatch(1) puts the
    # environment above the script, and the command line above both
    site = {"SBATCH_TIMELIMIT": "00:03:00", "SBATCH_NO_REQUEUE": "1", "SBATCH_SIGNAL": "USR2@30"}
    try:
        proc = subprocess.run([*SLURM, *SUBMIT, "--job-name", name, "--array", "trainer.max_steps=6", "--array",
                               "trainer.max_steps=8", *FAST, "strategy=single", "logger.mode=offline"], cwd=tmp_path,
                              env={**env(), **site}, capture_output=True, text=True, timeout=300)
    finally:   # a job left behind would hold the one-node cluster's slots for the next tests
        subprocess.run(["scancel", f"--name={name}"], capture_output=True)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    root = Path(re.search(r"Submitted batch job (\d+): 2 run\(s\) under (\S+)", proc.stdout).group(2))
    recs = [json.loads((root / str(i) / "run.json").read_text()) for i in (0, 1)]
    assert [r["status"] for r in recs] == ["completed", "completed"] and [r["steps"] for r in recs] == [6, 8]
    assert [r["slurm"]["array_task_id"] for r in recs] in (["0", "1"], [0, 1])
    summary = json.loads((root / "sweep.json").read_text())
    assert summary["num_completed"] == 2 and summary.get("wandb_run_id")
    assert (root / "report.html").is_file() and list((root / "wandb").glob("offline-run-*"))
    job = re.search(r"Submitted batch job (\d+)", proc.stdout).group(1)
    shown = subprocess.run(["scontrol", "show", "job", job], capture_output=True, text=True).stdout
    limits = subprocess.run(["sacct", "-n", "-X", "-P", "-o", "Timelimit", "-j", job], capture_output=True,
                            text=True).stdout.split()
    assert set(limits) == {"00:10:00"}, limits                    # the script's --time, not 00:03:00
    assert not shown or ("Requeue=1" in shown and "TimeLimit=00:10:00" in shown), shown


def test_recommend_verifies_its_candidates_as_slurm_jobs(tmp_path):
    """`recommend --verify --slurm`: one sbatch job per candidate, its ranks one srun step, the
    candidate's config group found on the job's hydra.searchpath on the compute node. It went
    through submitit_slurm, whose srun ran the Hydra job once per node and nested the ranks' step
    inside its own (refused or pending for good), and the searchpath never reached the job."""
    name = f"rec{os.getpid()}"
    out = tmp_path / "rec"
    try:
        proc = subprocess.run([sys.executable, "-m", "scalelab.cli", "recommend", "--model", "gpt_nano", "--devices",
                               "2", "--hardware", "this_cpu", "--strategies", "ddp", "--activation-checkpointing",
                               "none", "--verify", "1", "--verify-steps", "8", "--lr-check", "none", "--slurm",
                               "--train-arg", f"hydra.launcher.job_name={name}", "--out", str(out)],
                              cwd=tmp_path, env=env(), capture_output=True, text=True, timeout=300)
    finally:
        subprocess.run(["scancel", f"--name={name}"], capture_output=True)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    doc = json.loads((out / "recommendation.json").read_text())
    (row,) = doc["verification"]["ranking"]
    assert row["status"] == "completed" and doc["winner"]["strategy"] == "ddp"
    (job_id,) = json.loads((out / "verify" / "slurm" / "jobs.json").read_text()).values()
    assert sacct_state(job_id) == "COMPLETED"
    script = (out / "verify" / "slurm" / "job0.sbatch").read_text()
    assert f"'hydra.searchpath=[file://{(out / 'conf').resolve()}]'" in script and "+recommend_candidate=c0" in script
    rec = json.loads((out / "verify" / "0" / "run.json").read_text())
    assert (rec["world_size"], rec["steps"], rec["slurm"]["job_id"]) == (2, 8, job_id)

"""Following submitted SLURM jobs: their states from accounting (sacct) and the queue (squeue),
waiting until every one is done for good (a requeued job is pending again), and their final
state on their run records (finalize). Used by `scalelab slurm submit --wait` and the sweep
launcher (hydra_plugins/scalelab_slurm_launcher)."""
from __future__ import annotations

import json
import subprocess
import sys
import time
from pathlib import Path

# Job states after which a job will not run again (a REQUEUED / PREEMPTED job that SLURM requeues
# goes back to PENDING; `squeue` still lists it).
DONE = ("COMPLETED", "FAILED", "CANCELLED", "TIMEOUT", "OUT_OF_MEMORY", "NODE_FAIL", "BOOT_FAIL", "DEADLINE",
        "PREEMPTED", "REVOKED")


def sacct(job_ids: list[str]) -> dict[str, dict] | None:
    """{job id (array tasks as ID_TASK): {"state", "exit_code", "reason", "node_list"}} from accounting;
    None where accounting does not answer (a slow slurmdbd was a TimeoutExpired traceback that left
    the jobs running unfollowed): the caller asks again."""
    try:
        out = subprocess.run(["sacct", "-n", "-P", "-X", "-o", "JobID,State,ExitCode,Reason,NodeList",
                              "-j", ",".join(sorted({j.split("_")[0] for j in job_ids}))],
                             capture_output=True, text=True, timeout=60).stdout
    except (OSError, subprocess.TimeoutExpired) as e:
        _note_once(f"sacct gave no answer ({type(e).__name__}): asking again")
        return None
    rows = {}
    for line in out.splitlines():
        jid, state, code, reason, nodes = (line.split("|") + [""] * 5)[:5]
        st = state.split()[0] if state else "UNKNOWN"
        rows[jid] = {"state": st, "exit_code": code, "reason": _reason(st, code, state, reason),
                     "node_list": nodes, "state_detail": state}
    return rows


def _reason(state: str, code: str, detail: str, pending_reason: str) -> str | None:
    """Why a job ended, in squeue's words. sacct's Reason is the job's last *pending* reason
    (BeginTime after a requeue, None mostly), so it is derived from the state and exit code."""
    rc, _, sig = (code or "0:0").partition(":")
    if state == "COMPLETED":
        return None
    if state == "FAILED":
        return f"NonZeroExitCode (exit {rc})" if rc not in ("", "0") else f"RaisedSignal:{sig}"
    if state == "TIMEOUT":
        return "TimeLimit"
    if state == "CANCELLED":
        return detail  # "CANCELLED by UID"
    if state == "OUT_OF_MEMORY":
        return "OutOfMemory"
    return pending_reason if pending_reason and pending_reason != "None" else state


def wait(job_ids: list[str], poll_s: float = 1.0, grace_s: float = 60.0, silent_s: float = 900.0) -> dict[str, dict]:
    """Block until every job is done for good (a requeued job is pending again, not done). A job
    gone from the queue that accounting still does not show as done after grace_s (of answers
    from both) is UNKNOWN. squeue or sacct failing is asked again, not taken as an answer (running
    jobs got failed records); once accounting says every job is done, a squeue failing for
    grace_s more is not waited for; neither answering for silent_s ends the wait (UNKNOWN)."""
    gone_since, pending, done_since, silent_since = None, {}, None, None
    while True:
        rows = sacct(job_ids)
        queued = _squeue(job_ids)
        now = time.monotonic()
        live = [q.split("|")[0].strip() for q in queued or () if q.strip()]
        _say_pending(queued or [], pending)
        states = {j: (rows or {}).get(j) for j in job_ids}
        done = all(s and s["state"] in DONE for s in states.values())
        done_since = (done_since or now) if done and queued is None else None   # squeue failing: since when
        if done and ((queued is not None and not live) or (done_since and now - done_since > grace_s)):
            return {j: s for j, s in states.items() if s}
        silent_since = (silent_since or now) if rows is None or queued is None else None
        # gone from the queue, and accounting answered: the grace runs (a failing squeue's empty
        # output, or a sacct timing out, made jobs UNKNOWN "not in accounting" after grace_s)
        gone_since = (gone_since or now) if queued is not None and not live and rows is not None else None
        if (gone_since and now - gone_since > grace_s) or (silent_since and now - silent_since > silent_s):
            why = ("not in accounting (is slurmdbd up?)" if gone_since and now - gone_since > grace_s
                   else f"squeue / sacct gave no answer for {silent_s:g} s")
            unknown = {"state": "UNKNOWN", "exit_code": None, "reason": why, "node_list": None}
            return {j: s if s and s["state"] in DONE else unknown for j, s in states.items()}
        time.sleep(poll_s)


def _squeue(job_ids: list[str]) -> list[str] | None:
    """squeue's lines for the jobs (ID|STATE|REASON); None when squeue failed or gave no answer:
    not "none queued". A job squeue no longer knows is an empty answer with exit 0 (with -j, some
    versions exit 1 saying "Invalid job id specified": that is an empty answer too)."""
    try:
        proc = subprocess.run(["squeue", "-h", "-o", "%i|%T|%r", "-j", ",".join(sorted({j.split("_")[0]
                                                                                        for j in job_ids}))],
                              capture_output=True, text=True, timeout=60)
    except (OSError, subprocess.TimeoutExpired) as e:
        _note_once(f"squeue gave no answer ({type(e).__name__}): asking again")
        return None
    if proc.returncode != 0 and "invalid job id" not in proc.stderr.lower():
        _note_once(f"squeue failed ({(proc.stderr.strip().splitlines() or ['exit ' + str(proc.returncode)])[-1]}): "
                   "asking again")
        return None
    return proc.stdout.splitlines()


_NOTED: set[str] = set()


def _note_once(line: str) -> None:
    if line not in _NOTED:
        _NOTED.add(line)
        print(f"[scalelab] warning: {line}", file=sys.stderr, flush=True)


def _say_pending(queued: list[str], pending: dict, quiet_s: float = 10.0) -> None:
    """A job pending for quiet_s says why (squeue's reason), once per reason: `--wait` on a job that
    waits for resources, a reservation or its priority is not silent."""
    now = time.monotonic()
    for q in queued:
        jid, state, reason = (q.split("|") + ["", ""])[:3]
        if state != "PENDING":
            pending.pop(jid, None)
            continue
        was, since, said = pending.get(jid, (None, now, None))
        since = since if was == reason else now
        if reason not in (said, "None", "") and now - since >= quiet_s:
            print(f"[scalelab] SLURM job {jid}: pending ({reason})", file=sys.stderr, flush=True)
            said = reason
        pending[jid] = (reason, since, said)


def finalize(job_dir: Path, st: dict, job_id: str, meta=None, log: Path | None = None) -> dict:
    """Put the job's final SLURM state on its run.json; a job that ended before writing one (a
    crashed batch step, cancelled, timed out) gets a failed record naming the state and reason,
    with what META (a dict, or a callable giving one: only called then) says of the job. LOG: the
    job's sbatch output file, named in the error where the job failed."""
    from scalelab.results.record import RUN_FILE, write_json

    path = job_dir / RUN_FILE
    try:
        rec = json.loads(path.read_text())
    except (OSError, ValueError):
        rec = None
    earlier = str(((rec if isinstance(rec, dict) else {}).get("slurm") or {}).get("job_id") or "")
    if isinstance(rec, dict) and earlier != str(job_id):
        # an earlier job's record, a SLURM job's or a local run's (no slurm section): this job's own
        # run removes it before its ranks start, and every record written in a SLURM job has its id
        if rec.get("status") == "completed":
            # its completed run, kept (a sweep run again: train.py keeps it and runs nothing): this
            # job's end is not that run's (cancelled while it waited, it turned the record failed,
            # with job 318's id beside job 342's CANCELLED state)
            return rec
        rec = None   # an earlier failure: this job ended before its own record; say that instead
    if not isinstance(rec, dict):
        meta = (meta() if callable(meta) else meta) or _meta_from(job_dir)
        rec = {"status": "failed", "strategy": meta.get("strategy", "?"), "world_size": meta.get("world_size", 1),
               "global_batch_size": meta.get("global_batch_size", 1),
               "throughput": {"samples_per_s": None, "tokens_per_s": None},
               "job": {"name": meta.get("name", job_dir.name), "dir": str(job_dir),
                       "sweep_dir": meta.get("sweep_dir")},   # its sweep's efficiency (results.sweep) finds it
               "error": f"SLURM job {job_id} ended {st.get('state_detail') or st['state']} (reason {st.get('reason')}, "
                        f"exit {st.get('exit_code')}) without a run record; see {log or 'the job sbatch log'}"}
        task = str(job_id).partition("_")[2]
        rec["slurm"] = {"job_id": str(job_id), **({"array_task_id": int(task)} if task.isdigit() else {})}
    if st["state"] != "COMPLETED" and rec.get("status") == "completed":
        rec["status"] = "failed"
        rec["error"] = f"SLURM job {job_id} ended {st['state']} ({st.get('reason')}) after its run record"
    rec["slurm"] = {**(rec.get("slurm") or {"job_id": job_id}), **{k: st.get(k) for k in
                                                                  ("state", "exit_code", "reason", "node_list")}}
    if rec["status"] != "completed" and st["state"] not in rec.get("error", ""):
        rec["error"] = f"SLURM {st['state']} ({st.get('reason')}): {rec.get('error')}"
    if rec["status"] != "completed":
        rec["error"] = _final_word(str(rec.get("error")), st["state"], job_id, log)
    job_dir.mkdir(parents=True, exist_ok=True)
    write_json(path, rec)
    return rec


def _final_word(error: str, state: str, job_id: str, log: Path | None) -> str:
    """The failed job's error as its end makes it: the ranks' SIGTERM line said "SLURM ends or
    requeues job N itself (a requeued job resumes from it)", which a CANCELLED or TIMEOUT job is not
    (found by review: `scancel` of a sweep's job read as if it would come back); then its log."""
    from scalelab.requeue import SLURM_DECIDES

    head, sep, _ = error.partition(SLURM_DECIDES.format(job=job_id))
    if sep and state in ("CANCELLED", "TIMEOUT", "PREEMPTED", "NODE_FAIL", "FAILED"):
        error = (f"{head}; SLURM ended the job ({state}), so it is not requeued: the same command (a sweep: "
                 "with hydra.sweep.dir set to its folder) goes on from that checkpoint")
    if log is not None and str(log) not in error:
        error += f"; log: {log}"
    return error


def _meta_from(job_dir: Path) -> dict:
    """Strategy, world size and batch from the job's saved config, when it got that far."""
    try:
        from omegaconf import OmegaConf

        c = OmegaConf.to_container(OmegaConf.load(job_dir / "config_resolved.yaml"))
        return {"strategy": c["strategy"]["name"], "world_size": c["trainer"]["devices"] * c["trainer"]["num_nodes"],
                "global_batch_size": c["data"]["global_batch_size"], "name": c["job"]["name"],
                "sweep_dir": c["job"].get("sweep_dir")}
    except Exception:  # noqa: BLE001 - nothing saved: the record says so with what it has
        return {}

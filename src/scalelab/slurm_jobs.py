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


def sacct(job_ids: list[str]) -> dict[str, dict]:
    """{job id (array tasks as ID_TASK): {"state", "exit_code", "reason", "node_list"}} from accounting."""
    out = subprocess.run(["sacct", "-n", "-P", "-X", "-o", "JobID,State,ExitCode,Reason,NodeList",
                          "-j", ",".join(sorted({j.split("_")[0] for j in job_ids}))],
                         capture_output=True, text=True, timeout=60).stdout
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


def wait(job_ids: list[str], poll_s: float = 1.0, grace_s: float = 60.0) -> dict[str, dict]:
    """Block until every job is done for good (a requeued job is pending again, not done). A job
    gone from the queue that accounting still does not show as done after grace_s is UNKNOWN."""
    gone_since, pending = None, {}
    while True:
        rows = sacct(job_ids)
        queued = subprocess.run(["squeue", "-h", "-o", "%i|%T|%r", "-j",
                                 ",".join(sorted({j.split("_")[0] for j in job_ids}))],
                                capture_output=True, text=True).stdout.splitlines()
        live = [q.split("|")[0].strip() for q in queued if q.strip()]
        _say_pending(queued, pending)
        states = {j: rows.get(j) for j in job_ids}
        if not live and all(s and s["state"] in DONE for s in states.values()):
            return {j: s for j, s in states.items() if s}
        gone_since = (gone_since or time.monotonic()) if not live else None
        if gone_since and time.monotonic() - gone_since > grace_s:
            unknown = {"state": "UNKNOWN", "exit_code": None, "reason": "not in accounting (is slurmdbd up?)",
                       "node_list": None}
            return {j: s if s and s["state"] in DONE else unknown for j, s in states.items()}
        time.sleep(poll_s)


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


def finalize(job_dir: Path, st: dict, job_id: str, meta: dict | None = None) -> dict:
    """Put the job's final SLURM state on its run.json; a job that ended before writing one (a
    crashed batch step, cancelled, timed out) gets a failed record naming the state and reason."""
    from scalelab.results.record import RUN_FILE, write_json

    path = job_dir / RUN_FILE
    try:
        rec = json.loads(path.read_text())
    except (OSError, ValueError):
        meta = meta or _meta_from(job_dir)
        rec = {"status": "failed", "strategy": meta.get("strategy", "?"), "world_size": meta.get("world_size", 1),
               "global_batch_size": meta.get("global_batch_size", 1),
               "throughput": {"samples_per_s": None, "tokens_per_s": None},
               "job": {"name": meta.get("name", job_dir.name), "dir": str(job_dir),
                       "sweep_dir": meta.get("sweep_dir")},   # its sweep's efficiency (results.sweep) finds it
               "error": f"SLURM job {job_id} ended {st.get('state_detail') or st['state']} (reason {st.get('reason')}, "
                        f"exit {st.get('exit_code')}) without a run record; see the job's sbatch log"}
    if st["state"] != "COMPLETED" and rec.get("status") == "completed":
        rec["status"] = "failed"
        rec["error"] = f"SLURM job {job_id} ended {st['state']} ({st.get('reason')}) after its run record"
    rec["slurm"] = {**(rec.get("slurm") or {"job_id": job_id}), **{k: st.get(k) for k in
                                                                  ("state", "exit_code", "reason", "node_list")}}
    if rec["status"] != "completed" and st["state"] not in rec.get("error", ""):
        rec["error"] = f"SLURM {st['state']} ({st.get('reason')}): {rec.get('error')}"
    job_dir.mkdir(parents=True, exist_ok=True)
    write_json(path, rec)
    return rec


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

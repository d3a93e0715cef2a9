"""A job's outcome once its ranks exited: rank 0's record, or a failed record that says why
(the first failure, how far the run got, the SLURM attempt), or a node's own record where global
rank 0 ran on another node (launcher=torchrun); and the one-line summary a sweep prints per job."""
from __future__ import annotations

import os
import re
from pathlib import Path

from scalelab import launch, requeue, spawn
from scalelab.checkpointing import DAMAGED, PROGRESS, RESUMED, read_mark
from scalelab.results.record import RUN_FILE, base_record

ATTEMPT_MARK = "[scalelab] SLURM attempt: job"
RERUN_MARK = "[scalelab] run again in this folder at"   # ranks.log: a rerun outside SLURM (unix time)


def mark_attempt(job_dir: Path, what: str = "") -> None:
    """A line in ranks.log for this SLURM attempt: ranks.log keeps every attempt; errors are read
    from the last one (after the last ATTEMPT_MARK)."""
    with open(job_dir / "ranks.log", "a") as f:
        f.write(f"{ATTEMPT_MARK} {os.environ['SLURM_JOB_ID']} requeue {requeue.requeue_count()}{what}\n")


def node_record(resolved: dict, spec, threads: int, layout: dict) -> dict:
    """A node whose ranks exited 0 but did not hold global rank 0: it has only its logs; the run
    record is on rank 0's node."""
    import socket

    record = base_record(resolved, spec.batch, spec.lr, spec.run.world_size,
                         spec.plan.parallel_degrees(spec.run.world_size), spec.run.model_arch, None,
                         spec.run.accelerator, threads)
    record.update(status="completed", returncode=0, steps=int(resolved["trainer"]["max_steps"]),   # all of them, not 0
                  node_rank=layout["node_rank"], hostname=socket.gethostname(),
                  record_on_node=0, rdzv_endpoint=layout["endpoint"],
                  note="this node's ranks completed; the run record (figures, losses, placement) is written by "
                       "global rank 0's node")
    return record


def rendezvous_error(job_dir: Path, layout: dict) -> str | None:
    """launcher=torchrun whose ranks never started: the rendezvous failed (a node did not join in
    time, the endpoint is unreachable). One line naming the endpoint, the node and the cause."""
    log = job_dir / "ranks.log"
    text = log.read_text(errors="replace") if log.exists() else ""
    causes = [ln.strip() for ln in text.splitlines()
              if re.match(r"\s*(torch\.distributed\.\S*(Dist\w*Error|Rendezvous\w*Error)|\S*TimeoutError)\b", ln)]
    if not causes:
        return None
    if re.search(r"EADDRINUSE|address already in use", causes[-1], re.I):  # node 0 could not host the store
        hint = (f"port {layout['endpoint'].rpartition(':')[2]} is taken on this host: give every node another "
                "port in launcher.rdzv_endpoint")
    else:
        hint = (f"every node must run the same command with its own launcher.node_rank within "
                f"launcher.rdzv_timeout_s={layout['timeout_s']:g}")
        joined = re.search(r"(\d+)/(\d+) clients joined", causes[-1])
        if joined:   # node 0 counts the nodes that came: one given a smaller trainer.num_nodes never says so
            hint = (f"{joined.group(1)} of the {joined.group(2)} nodes this one expects (trainer.num_nodes="
                    f"{joined.group(2)} here) joined: {hint}, and the same trainer.num_nodes")
    return f"rendezvous at {layout['endpoint']} failed on node {layout['node_rank']}: {causes[-1][:300]} ({hint})"


def one_line(record: dict) -> str:
    if record["status"] != "completed":
        return f"[scalelab] {record['job']['name']}: {record['status']}"
    if record.get("record_on_node") is not None:  # launcher=torchrun, a node without global rank 0
        return (f"[scalelab] {record['job']['name']}: node {record.get('node_rank')}'s ranks completed; the run "
                f"record (figures, losses) is on node {record['record_on_node']}")
    thr, st, loss = record["throughput"], record["step_time_s"], record["loss"]["final"]
    return (f"[scalelab] {record['job']['name']}: completed, {thr.get('samples_per_s') or 0:.1f} samples/s, "
            f"step {(st.get('median') or 0) * 1e3:.1f} ms (median of {st.get('measured_steps')}), "
            f"loss {loss if loss is None else round(loss, 4)}")


def collect(job_dir: Path, rc: int, resolved: dict, spec, threads: int, since: float | None = None) -> dict:
    """The rank-0 record when the job succeeded; otherwise a failed record with the error. Where
    rank 0 had written its completed record after SINCE (this attempt's ranks started) and the job
    failed after it (a peer in its teardown, trainer.timeout_s in an exit that hung), the record
    keeps the measured figures: status failed, the error, `failed_after_record` true (a bare failed
    record replaced them)."""
    import json

    path = job_dir / RUN_FILE
    if rc == 0 and path.exists():
        return json.loads(path.read_text())
    measured = None
    try:
        if since is not None and path.stat().st_mtime >= since:
            measured = json.loads(path.read_text())
    except (OSError, ValueError):
        pass
    if isinstance(measured, dict) and measured.get("status") == "completed":
        measured.update(status="failed", returncode=rc, error=error_message(job_dir, rc, _node_ranks(resolved, spec)),
                        failed_after_record=True)
        return measured
    record = base_record(resolved, spec.batch, spec.lr, spec.run.world_size,
                         spec.plan.parallel_degrees(spec.run.world_size), spec.run.model_arch, None,
                         spec.run.accelerator, threads)
    record.update(status="failed", returncode=rc, error=error_message(job_dir, rc, _node_ranks(resolved, spec)))
    reached = read_mark(job_dir / PROGRESS)   # rank 0's progress mark (at most ~1 s old): how far it got
    # as a completed record says them: where this attempt started (a SLURM requeue, a rerun after a
    # crash) and the SLURM job (its requeue count, partition)
    resumed_at = read_mark(job_dir / RESUMED)
    if reached is not None or resumed_at:   # failed before its first step after a resume: where it was
        record["steps"] = reached if reached is not None else resumed_at
    record["resumed_at_step"] = resumed_at
    if resumed_at and reached is not None:
        record["steps_this_attempt"] = max(0, reached - resumed_at)
    ckpt = job_dir / "checkpoints" / f"step-{resumed_at or 0:08d}.ckpt"
    loading = resumed_at and (reached is None or reached <= resumed_at) and ckpt.exists()
    if loading and _LOAD_ERROR.search(record["error"]):
        # a sharded checkpoint damaged at its full size (no CRC to read before) fails every rerun
        # in its load, with an error that named no checkpoint
        record["error"] += (f" (before its first step after resuming from {ckpt}: if that checkpoint is damaged, "
                            f"set it aside, mv {ckpt} {ckpt}{DAMAGED}, and the job goes on from the one before "
                            "it; or start over with checkpoint.resume=never)")
    record["slurm"] = requeue.slurm_info()
    return record


def stopped_record(job_dir: Path, resolved: dict, spec, threads: int, how: str, rc: int,
                   layout: dict | None = None) -> dict:
    """The record of a job its ranks stopped (saved at an agreed step, then exited): SLURM's SIGTERM
    (a requeued attempt replaces it), Ctrl-C, a SIGTERM on another node. How far it got and its loss
    so far, from the curves its checkpoint keeps (a cancelled job's row read "-" everywhere; a
    Ctrl-C'd one had no record at all); a pipeline's loss is its last stage's."""
    from scalelab.checkpointing import mean_curve
    from scalelab.scaling.run_summary import loss_fields

    record = collect(job_dir, 1, resolved, spec, threads)
    record.update(status="failed", returncode=rc, error=f"stopped by {how}")
    stop = requeue.stopped_at(job_dir)   # the step the ranks saved and stopped at
    if stop is not None:
        record["steps"] = stop[0]
        curve = None if hasattr(spec.plan, "training_step") else mean_curve(
            job_dir / "checkpoints" / f"step-{stop[0]:08d}.ckpt", spec.run.world_size)
        if curve:
            record["loss"] = loss_fields(curve)
        if record.get("resumed_at_step"):
            record["steps_this_attempt"] = stop[0] - record["resumed_at_step"]
    if layout is not None:   # node K's part of a torchrun job (results.record.other_node_part: not a run)
        record.update(_node_fields(layout))
    return record


def _node_fields(layout: dict) -> dict:
    """Which node of a launcher=torchrun job a record is from."""
    import socket

    return {"node_rank": layout["node_rank"], "hostname": socket.gethostname(), "rdzv_endpoint": layout["endpoint"]}


def _node_ranks(resolved: dict, spec) -> list[int]:
    """The global ranks this node's launcher started (launcher=torchrun: node_rank x devices on)."""
    devices = int(spec.run.devices_per_node)
    node = int((resolved.get("launcher") or {}).get("node_rank") or 0) if spec.run.num_nodes > 1 else 0
    return list(range(node * devices, (node + 1) * devices))


def error_message(job_dir: Path, rc: int, ranks: list[int] = ()) -> str:
    """The first failure: the rank the launcher saw fail first (scalelab.spawn notes it in
    ranks.log; its peers were ended after it and their errors are consequences), else the rank
    whose error file says why (launch.cause_rank: not a peer's connection ending, the oldest),
    else the exit code and the log's last line. RANKS: this node's, for a collective's timeout
    (the rank that timed out only waited: those of them that wrote no error are named)."""
    if rc == 124:   # the launcher ended the ranks: their errors (SIGTERM, a lost peer) are its doing
        return "timed out (trainer.timeout_s)"
    log = job_dir / "ranks.log"
    text = re.split(f"{re.escape(ATTEMPT_MARK)}|{re.escape(RERUN_MARK)}",   # this attempt's part
                    log.read_text(errors="replace") if log.exists() else "")[-1]
    first = spawn.FAILED_FIRST.findall(text)
    # srun names the first task that exited badly first (its peers are ended after it)
    first = first or re.findall(r"srun: error: [^:\s]+: tasks? (\d+)[\d,-]*: (Exited with exit code \d+|[A-Z]\w+)", text)[:1]
    written = sorted(int(m.group(1)) for f in job_dir.glob("error-rank*.txt")
                     if (m := re.fullmatch(r"error-rank(\d+)\.txt", f.name)))
    cause = launch.cause_rank(job_dir, written)
    cause_line = launch.last_error_line(job_dir, cause) if cause is not None else None
    if first:
        rank, how = first[-1]
        line = launch.last_error_line(job_dir, int(rank))
        if (cause is not None and cause != int(rank) and line is not None and launch.PEER_GONE.search(line)
                and not launch.PEER_GONE.search(cause_line or "")):
            # srun saw this rank exit first, but it only lost its connection to the one that raised
            return f"rank {cause} failed: {cause_line} (rank {rank} exited first: {how})"
        return f"rank {rank} failed first ({how})" + (f": {line}" if line else "; its peers were ended")
    # torchrun's own first failure: a rank that wrote no error file (killed: the OOM killer's SIGKILL)
    torchrun = _torchrun_root_cause(text)
    if cause is not None and torchrun and (launch.PEER_GONE.search(cause_line or "")
                                           or launch.ENDED.search(cause_line or "")):
        # the only error files are its peers' (a lost connection, the SIGTERM that ended them)
        return f"{torchrun} (error-rank{cause}: {cause_line})"
    if cause is not None:   # worded as the local launcher's watch words it (it read "error-rank1: ...")
        return f"rank {cause} failed first: {cause_line}" + _hung(cause, cause_line, ranks, written)
    if torchrun:
        return torchrun
    # not one of scalelab's own notes (a killed launcher's log ended with the GLOO_SOCKET_IFNAME one,
    # quoted as the cause)
    tail = [ln for ln in text.splitlines() if ln.strip() and not _OWN_NOTE.match(ln)][-1:]
    signal_note = f" (killed by signal {-rc if rc < 0 else rc - 128})" if rc < 0 or rc > 128 else ""
    return f"ranks exited with code {rc}{signal_note}" + (f": {tail[0][:300]}" if tail else "")


def _hung(cause: int, line: str | None, ranks, written: list[int]) -> str:
    """'; rank R wrote no error ...' where CAUSE's error is a collective's timeout and ranks of this
    node wrote none (torchrun ended them): launch.hung_note, as spawn._hung_peers says it under launcher=local. A rank
    hung at a step was reported as its healthy peer's failure ("rank 0 failed first: ... Timed out")."""
    silent = [r for r in ranks if r not in written and r != cause]
    if not silent or not launch.TIMED_OUT.search(line or ""):
        return ""
    return launch.hung_note(silent, "wrote no error")


# what a checkpoint's load raises where its bytes are bad (torch's zip reader, unpickling, a
# sharded checkpoint's storage reads); not an OOM or a peer's timeout before the first step
_LOAD_ERROR = re.compile(r"PytorchStreamReader|zip archive|unpickl|invalid load key|EOFError|\.distcp|"
                         r"checkpoint|corrupt|CRC|truncated|UnpicklingError", re.I)
_OWN_NOTE = re.compile(r"\s*(\[rank\d+\]:\s*)?\[scalelab\] (?!error)")
_ROOT_CAUSE = re.compile(r"Root Cause \(first observed failure\):(.*?)(?:\n={8,}|\Z)", re.S)


def _torchrun_root_cause(text: str) -> str | None:
    """torchrun's own account of the first rank that failed (its "Root Cause" block), as spawn's
    watch says it: "rank 1 failed first (killed by signal 9)". A rank killed by a signal (the OOM
    killer's SIGKILL) writes no error file; the log's last line was the block's rule of '='."""
    blocks = _ROOT_CAUSE.findall(text)
    rank = re.search(r"^\s*rank\s*:\s*(\d+)", blocks[-1], re.M) if blocks else None
    code = re.search(r"^\s*exitcode\s*:\s*(-?\d+)", blocks[-1], re.M) if blocks else None
    if not (rank and code):
        return None
    rc = int(code.group(1))
    how = f"killed by signal {-rc}" if rc < 0 else f"exit code {rc}"
    return f"rank {rank.group(1)} failed first ({how}); torchrun's summary is in ranks.log"


def failed_on_node(record: dict, job_dir: Path, layout: dict) -> None:
    """launcher=torchrun, this node's ranks failed: which node the failed record is from, the steps
    only where this node knows them, and the rendezvous's or a peer's part in the error."""
    record.update(_node_fields(layout))
    # global rank 0 notes the steps: on node 0 (the static rendezvous)
    if (layout["node_rank"] != 0 and record.get("resumed_at_step") is None
            and not (job_dir / PROGRESS).exists()):
        record["steps"] = None   # unknown here, not 0
    if not any(job_dir.glob("error-rank*.txt")):
        record["error"] = rendezvous_error(job_dir, layout) or record.get("error")
    elif launch.PEER_GONE.search(str(record.get("error"))):
        # this node's first failure only lost its connection: not the job's first ("rank 0 failed first")
        record["error"] = re.sub(r"^rank (\d+) failed first", r"rank \1 failed on this node", str(record["error"]))
        record["error"] += (" (a peer's connection ended: the rank that failed first may be on another node, "
                            "whose ranks.log says why)")
    elif launch.TIMED_OUT.search(str(record.get("error"))):
        if "wrote no error" in record["error"]:   # a peer here wrote none: hung, or ended before its own timeout
            record["error"] += " (or on another node, whose ranks.log says why)"
        else:   # every rank here wrote its timeout: the one that hung or was slow is on another node
            record["error"] = re.sub(r"^rank (\d+) failed first", r"rank \1 failed on this node", record["error"])
            record["error"] += (" (it waited for a peer: the rank that hung or was slow may be on another node, "
                                "whose ranks.log says why)")

"""What a SLURM job's environment says: whether this is one, its node list expanded, how many times
it was requeued, and the job's part of run.json. Read by the batch step and the ranks alike
(scalelab.requeue, scalelab.rendezvous, scalelab.gloo_net)."""
from __future__ import annotations

import os
import re

STEP_ENV = "SCALELAB_SLURM_STEP"  # set for ranks started by srun under a SLURM batch job


def in_slurm_job(environ=None) -> bool:
    return bool((os.environ if environ is None else environ).get("SLURM_JOB_ID"))


def expand_nodelist(nodelist: str) -> list[str]:
    """SLURM's compressed host list ("gpu[07-08,10],login1") -> ["gpu07", "gpu08", "gpu10", "login1"]
    (zero padding kept); the ranks need no `scontrol show hostnames` for the first node. Every
    bracket group of a name expands, the first one slowest, as scontrol does:
    "rack[1-2]-n[01-02]" -> rack1-n01, rack1-n02, rack2-n01, rack2-n02 (before, only the first
    group expanded and the rest stayed in the name: "rack1-n[01-02]", which no host is)."""
    import itertools

    hosts = []
    for part in _top_level(nodelist):
        pieces = re.split(r"(\[[^\]]*\])", part)   # text, [group], text, [group], ...
        choices = [_bracket(p) if p.startswith("[") and p.endswith("]") else [p] for p in pieces if p]
        hosts.extend("".join(c) for c in itertools.product(*choices))
    return hosts


def _top_level(nodelist: str) -> list[str]:
    """The comma-separated names of a host list, commas inside brackets kept with their name."""
    parts, depth, cur = [], 0, ""
    for ch in nodelist or "":
        depth += (ch == "[") - (ch == "]")
        if ch == "," and depth <= 0:
            parts.append(cur)
            cur, depth = "", 0
        else:
            cur += ch
    parts.append(cur)
    return [p.strip() for p in parts if p.strip()]


def _bracket(group: str) -> list[str]:
    """"[07-08,10]" -> ["07", "08", "10"] (width of each range's low end kept); a group that is not
    numeric ranges stays as written."""
    out = []
    for r in group[1:-1].split(","):
        lo, _, hi = r.strip().partition("-")
        if not lo.isdigit() or (hi and not hi.isdigit()):
            return [group]
        out.extend(str(n).zfill(len(lo)) for n in range(int(lo), int(hi or lo) + 1))
    return out


def slurm_info(environ=None) -> dict | None:
    """What run.json records about the SLURM job (None outside SLURM)."""
    env = os.environ if environ is None else environ
    if not in_slurm_job(env):
        return None
    task = env.get("SLURM_ARRAY_TASK_ID")
    return {"job_id": env.get("SLURM_ARRAY_JOB_ID") + "_" + task if task and env.get("SLURM_ARRAY_JOB_ID")
            else env["SLURM_JOB_ID"], "raw_job_id": env["SLURM_JOB_ID"],
            "array_job_id": env.get("SLURM_ARRAY_JOB_ID"), "array_task_id": int(task) if task else None,
            "node_list": env.get("SLURM_JOB_NODELIST") or env.get("SLURM_NODELIST"),
            "nodes": expand_nodelist(env.get("SLURM_JOB_NODELIST") or env.get("SLURM_NODELIST") or ""),
            "partition": env.get("SLURM_JOB_PARTITION"), "requeues": requeue_count(env)}


def requeue_count(environ=None) -> int:
    """How many times SLURM has requeued this job (0 outside SLURM and on the first attempt)."""
    env = os.environ if environ is None else environ
    return int(env.get("SLURM_RESTART_COUNT") or 0) if in_slurm_job(env) else 0

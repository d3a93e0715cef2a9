"""What a SLURM job asks for, checked before it is submitted: a job the scheduler can never start
must be refused in one line, not left pending while `--wait` says nothing (a user walkthrough,
2026-12-01: 2 ranks x 8 CPUs on a 4-CPU node sat in PENDING (PartitionConfig) for good; a --time
under the warning signal's delay requeued the job every 30 s, forever).

- time_seconds / check_times: sbatch's --time formats, and a limit that leaves the job time to
  train before the USR1 warning (scalelab.requeue saves and requeues on it).
- test_only: `sbatch --test-only` on the finished script: slurmctld answers whether and when the
  job could run on this cluster (its partitions, nodes, CPUs, GPUs, limits) without queueing it.
- srun_cpus_per_task / srun_crowded: what a launcher=srun job's ranks get of the allocation, from
  its environment, not from the host scalelab-train runs on (their threads: launch.threads_per_rank
  over per_task x ranks cores).
"""
from __future__ import annotations

import os
import re
import shlex
import subprocess
import sys
from pathlib import Path

TIME_FORMATS = "MINUTES, MM:SS, HH:MM:SS, D-HH, D-HH:MM or D-HH:MM:SS (or UNLIMITED / 0: no limit)"
_TIME = re.compile(r"^(?:(\d+)-)?(\d+)(?::(\d+))?(?::(\d+))?$")
# Start-up (imports, data, model, first steps) measured 10-30 s per job on CPU here and 23-45 s on a
# GPU host (issue 11): an attempt shorter than this between its start and the warning signal saves
# little or nothing before it is requeued again.
MIN_TRAIN_BEFORE_SIGNAL_S = 120


def time_seconds(text: str, name: str = "--time") -> int | None:
    """sbatch --time in seconds; None for no limit. ValueError naming the value and the formats."""
    t = str(text).strip()
    if t.upper() in ("UNLIMITED", "INFINITE"):
        return None
    m = _TIME.match(t)
    if m is None:
        raise ValueError(f"{name} {t!r} is not a SLURM time: use {TIME_FORMATS}")
    days, a, b, c = m.groups()
    if days is not None:      # D-HH[:MM[:SS]]
        secs = int(days) * 86400 + int(a) * 3600 + int(b or 0) * 60 + int(c or 0)
    elif c is not None:       # HH:MM:SS
        secs = int(a) * 3600 + int(b) * 60 + int(c)
    elif b is not None:       # MM:SS
        secs = int(a) * 60 + int(b)
    else:                     # MINUTES
        secs = int(a) * 60
    return secs or None   # sbatch(1): a time limit of zero requests that no time limit be imposed


def check_times(time: str, signal_delay_s: int, names: tuple[str, str] = ("--time", "--signal-delay")) -> None:
    """The time limit must leave MIN_TRAIN_BEFORE_SIGNAL_S of training before the USR1 warning, at
    worst: SLURM rounds the limit up to whole minutes, and may send the signal up to 60 s early
    (sbatch(1), --signal)."""
    if not 0 <= int(signal_delay_s) <= 65535:   # sbatch(1) --signal: "between 0 and 65535"
        raise ValueError(f"{names[1]} {signal_delay_s} must be between 0 and 65535 (seconds before the time limit; "
                         "SLURM's bound)")
    secs = time_seconds(time, names[0])
    if secs is None:
        return
    worst = -(-secs // 60) * 60 - int(signal_delay_s) - 60
    if worst < MIN_TRAIN_BEFORE_SIGNAL_S:
        least = int(signal_delay_s) + 60 + MIN_TRAIN_BEFORE_SIGNAL_S
        raise ValueError(f"{names[0]} {time} ({secs} s) leaves {max(worst, 0)} s before the warning signal at worst "
                         f"({names[1]} {signal_delay_s} s before the limit, which SLURM may send up to 60 s early): "
                         f"each attempt would save and requeue before it trains; give {names[0]} of at least "
                         f"{least} s or a smaller {names[1]}")


def _over_time_limit(script: str) -> str | None:
    """Why the script's #SBATCH --time is above its partition's time limit (sinfo %l; the default
    partition's where it names none), or None: under SLURM's default EnforcePartLimits=NO such a
    job is accepted and left PENDING (PartitionTimeLimit) for good, and `--wait` waited with it."""
    asked = re.search(r"^#SBATCH --time=(\S+)", script, re.M)
    part = _partition(script)
    if not asked or (part and "," in part):
        return None
    try:
        out = subprocess.run(["sinfo", "-h", "-o", "%P|%l"], capture_output=True, text=True, timeout=30).stdout
        want = time_seconds(asked.group(1))
    except (OSError, subprocess.TimeoutExpired, ValueError):
        return None
    for line in out.splitlines():
        name, _, limit = line.partition("|")
        default = name.endswith("*")
        if (part and name.rstrip("*") != part) or (not part and not default):
            continue
        try:
            most = time_seconds(limit.strip()) if limit.strip().lower() not in ("infinite", "n/a") else None
        except ValueError:
            return None
        # no limit asked (UNLIMITED, 0) on a partition that has one pends (PartitionTimeLimit) too
        if most is not None and (want is None or want > most):
            return (f"--time {asked.group(1)} is above partition {name.rstrip('*')}'s time limit {limit.strip()}: "
                    "give a --time within it or another --partition")
        return None
    return None


def _partitions() -> str:
    """`name: N node(s) x C CPUs [GRES]` per partition, from sinfo; '' if sinfo says nothing."""
    try:
        out = subprocess.run(["sinfo", "-h", "-o", "%P|%D|%c|%G|%l"], capture_output=True, text=True,
                             timeout=30).stdout
    except (OSError, subprocess.TimeoutExpired):
        return ""
    parts = []
    for line in out.splitlines():
        name, nodes, cpus, gres, limit = (line.split("|") + [""] * 5)[:5]
        extra = f" {gres}" if gres and gres != "(null)" else ""
        parts.append(f"{name} ({nodes} node(s) x {cpus} CPUs{extra}, time limit {limit})")
    return "; ".join(parts)


# sbatch --test-only's answers that a real submission would get too, or that no job of this
# shape could ever get past: the request itself is wrong for this cluster.
REFUSED = ("Invalid partition", "More processors requested than permitted", "Node count specification invalid",
           "Requested time limit is invalid", "Invalid generic resource", "Invalid account", "Invalid qos")
# ... and this one only while every node is up: test-only counts the nodes that are up, not those
# down, drained or in maintenance, for which a real submission would wait (ReqNodeNotAvail).
NO_NODES = "Requested node configuration is not available"


def _partition(script: str) -> str | None:
    """The partition the job goes to: the script's, else SBATCH_PARTITION's (sbatch takes it from the
    environment where the script names none; where it names one, that is also on sbatch's command
    line, which beats the environment: directives); None: the default one."""
    named = re.search(r"^#SBATCH --partition=(\S+)", script, re.M)
    part = shlex.split(named.group(1))[0] if named else os.environ.get("SBATCH_PARTITION", "").strip()
    return part or None


def _nodes_unavailable(partition: str | None = None) -> bool:
    """Whether sinfo lists any node of PARTITION (all partitions where None) down, drained, failing
    or in maintenance (or cannot say). Unscoped, one drained node anywhere on a real cluster (there
    almost always is one) turned every impossible request into a warning and a submission."""
    try:
        if partition is None:   # the default partition (sinfo marks it with *)
            names = subprocess.run(["sinfo", "-h", "-o", "%P"], capture_output=True, text=True, timeout=30).stdout
            partition = next((n.rstrip("*") for n in names.split() if n.endswith("*")), None)
        proc = subprocess.run(["sinfo", "-h", *(["-p", partition] if partition else []), "-t",
                               "down,drain,fail,maint,no_respond", "-o", "%D"], capture_output=True, text=True,
                              timeout=30)
    except (OSError, subprocess.TimeoutExpired):
        return True
    return proc.returncode != 0 or any(int(n) > 0 for n in proc.stdout.split() if n.isdigit())


def directives(script: Path) -> list[str]:
    """The script's #SBATCH options as sbatch command-line arguments. sbatch(1): "Environment
    variables will override any options set in a batch script, and command line options will
    override any environment variables": a site's SBATCH_TIMELIMIT, SBATCH_SIGNAL or
    SBATCH_NO_REQUEUE (profile.d) replaced the checked time limit, the warning signal the ranks
    save on, and --requeue. Given on the command line, what was checked is what is submitted;
    an option the script does not set (SBATCH_ACCOUNT, a partition it names none of) still comes
    from the environment."""
    out = []
    for line in script.read_text().splitlines():
        if line.startswith("#SBATCH "):
            out += shlex.split(line[len("#SBATCH "):], comments=True)
    return out


def test_only(script: Path, asked: str) -> None:
    """`sbatch --test-only SCRIPT`: ValueError (one line: SLURM's reason, what was asked, what this
    cluster has) when the scheduler could never start the job. `asked`: the request, in words.
    Any other answer (a slow or busy controller, a node down that a real submission would wait
    for, a test that does not return) is a warning, and the job is submitted as it would have been."""
    try:
        proc = subprocess.run(["sbatch", "--test-only", *directives(script), str(script)], capture_output=True,
                              text=True, timeout=60)
    except FileNotFoundError:
        raise RuntimeError("sbatch not found: run this on a SLURM login node") from None
    except subprocess.TimeoutExpired:
        print("[scalelab] warning: sbatch --test-only gave no answer in 60 s: submitting without that check",
              file=sys.stderr, flush=True)
        return
    if proc.returncode == 0:
        over = _over_time_limit(script.read_text())
        if over:   # test-only passes it where EnforcePartLimits=NO; the job would pend (PartitionTimeLimit) for good
            have = _partitions()
            raise ValueError(f"SLURM would never start this job ({over}): asked for {asked}"
                             + (f"; partitions here: {have}" if have else "") + "; nothing was submitted")
        return
    words = [ln.strip() for ln in (proc.stderr + proc.stdout).splitlines() if ln.strip()]
    why = words[-1] if words else f"sbatch --test-only exited {proc.returncode}"
    why = re.sub(r"^(sbatch: error: |allocation failure: )", "", why)
    wrong = any(r.lower() in why.lower() for r in REFUSED) or (NO_NODES.lower() in why.lower()
                                                                and not _nodes_unavailable(_partition(script.read_text())))
    if not wrong:
        print(f"[scalelab] warning: sbatch --test-only could not check the job ({why}): submitting it anyway",
              file=sys.stderr, flush=True)
        return
    have = _partitions()
    raise ValueError(f"SLURM would never start this job ({why}): asked for {asked}"
                     + (f"; partitions here: {have}" if have else "") + "; nothing was submitted")


def srun_cpus_per_task(ranks_per_node: int, environ=None) -> int | None:
    """launcher=srun: the CPUs each rank's task gets in the job's allocation, from its environment
    (SLURM_CPUS_PER_TASK; else the allocation's CPUs per node over the node's ranks); None outside
    an allocation. scalelab-train may run on a login node (an salloc shell), whose cores are not
    the ranks' (threads_per_rank was the login node's cores / ranks)."""
    env = os.environ if environ is None else environ
    given = str(env.get("SLURM_CPUS_PER_TASK", "")).strip()
    if given.isdigit() and int(given) > 0:
        return int(given)
    # SLURM_JOB_CPUS_PER_NODE: "8(x2)" or "40,8" (each node's); the smallest node bounds every rank
    per_node = [int(n) for n in re.findall(r"(\d+)(?:\(x\d+\))?", str(env.get("SLURM_JOB_CPUS_PER_NODE", "")))]
    if not per_node and str(env.get("SLURM_CPUS_ON_NODE", "")).strip().isdigit():
        per_node = [int(env["SLURM_CPUS_ON_NODE"])]
    return max(1, min(per_node) // max(1, ranks_per_node)) if per_node and min(per_node) > 0 else None


def srun_crowded(ranks_per_node: int, threads: int, per_task: int, accelerator: str) -> str | None:
    """launch.oversubscribed for srun ranks: threads above the task's CPUs share them."""
    if accelerator != "cpu" or threads <= per_task:
        return None
    return (f"[scalelab] warning: {ranks_per_node} ranks x {threads} thread(s) on {per_task} CPU(s) per task: the "
            "ranks share cores, so step time, throughput, scaling efficiency and MFU measure that contention "
            f"(trainer.threads_per_rank <= {per_task}, or more CPUs per task)")

"""Start one job's ranks as fresh processes: torchrun locally, srun under SLURM.

Hydra never runs inside a rank (Lightning's own re-launch re-runs sys.argv, which under
`-m` starts a nested sweep; see shared/notes/cpu-strategies.md section 2). Each rank runs
`python -m scalelab.worker JOB_DIR`, reading the resolved config the job saved there.
"""
from __future__ import annotations

import math
import os
import re
import select
import subprocess
import sys
import time
from pathlib import Path

# the ranks' stop (grace, wait, process-group signals) and the rendezvous live in their own modules;
# their names stay importable from here
from scalelab.paths import wandb_dirs
from scalelab.rank_stop import KILL_WAIT_S, STOP_GRACE_S, kill_group, stop_grace_s, stopping_line, wait_for
from scalelab.rendezvous import RDZV_BACKENDS, free_port, parse_endpoint, torchrun_layout

__all__ = ["FAILED_JOBS", "threads_per_rank", "too_few_gpus", "host_cores", "oversubscribed", "NO_SHARED_STORE",
           "rank_env", "rank_command", "PEER_GONE", "TIMED_OUT", "ENDED", "last_error_line", "cause_rank", "TracebackFilter",
           "run_ranks", "console_end", "with_parent_death_signal",
           # from scalelab.rank_stop and scalelab.rendezvous
           "KILL_WAIT_S", "STOP_GRACE_S", "stop_grace_s", "stopping_line", "wait_for",
           "RDZV_BACKENDS", "free_port", "parse_endpoint", "torchrun_layout"]

FAILED_JOBS: list[str] = []  # this command's failed jobs ("name: error"), for its exit code (scalelab.train)

# Variables that would make the ranks think they are already inside another launch.
_LAUNCH_VARS = ("LOCAL_RANK", "RANK", "WORLD_SIZE", "LOCAL_WORLD_SIZE", "GROUP_RANK", "ROLE_RANK",
                "ROLE_WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT", "NODE_RANK", "PL_GLOBAL_SEED",
                "PL_TRAINER_GPUS", "PL_EXP_VERSION", "TORCHELASTIC_RUN_ID", "TORCHELASTIC_RESTART_COUNT",
                "TORCHELASTIC_MAX_RESTARTS", "TORCHELASTIC_USE_AGENT_STORE", "OMP_NUM_THREADS")


def threads_per_rank(requested, ranks_per_node: int, accelerator: str = "cpu", cores: int | None = None) -> int:
    """CPU threads (torch intra-op, OMP) per rank. `null` (the default): 1 on CPU, where a
    "device" is a rank of one thread, and cores / ranks on GPU, where the host threads feed the
    device (data, optimizer on host, model init) and 1 thread starves them. `auto`: cores / ranks.
    cores: the node's cores for its ranks (None: this host's; srun: the allocation's CPUs per task
    x ranks, slurm_request.srun_cpus_per_task)."""
    if requested not in (None, "auto"):
        return max(1, int(requested))
    if requested is None and accelerator == "cpu":
        return 1
    return max(1, (host_cores() if cores is None else cores) // ranks_per_node)


def too_few_gpus(visible: int, devices_per_node: int, launcher: str) -> str | None:
    """Why a GPU rank cannot have its device: it sees fewer GPUs than the node's ranks (each rank
    uses cuda:LOCAL_RANK of all of its node's GPUs, as Lightning does). Under srun that is
    per-task binding (--gpus-per-task=1, --gpu-bind, a site's cli_filter): each task sees one GPU."""
    if visible >= devices_per_node:
        return None
    why = (" (srun binds GPUs per task: --gpus-per-task or --gpu-bind; ask for --gpus-per-node instead, "
           "so every rank sees all of its node's GPUs)" if launcher == "srun" else "")
    return f"this rank sees {visible} GPU(s) but trainer.devices={devices_per_node} ranks run on its node{why}"


def host_cores() -> int:
    """The cores this process may run on (its affinity: a SLURM allocation's, a container's)."""
    return len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1


def oversubscribed(ranks_per_node: int, threads: int, accelerator: str) -> str | None:
    """The warning for CPU ranks x threads above this node's cores: the ranks then share cores and
    every figure measures that contention (8 ddp ranks on 2 cores ran, and their MFU was computed
    against 8 cores' peak), else None."""
    cores = host_cores()
    if accelerator != "cpu" or ranks_per_node * threads <= cores:
        return None
    return (f"[scalelab] warning: {ranks_per_node} ranks x {threads} thread(s) on {cores} cores: the ranks share "
            "cores, so step time, throughput, scaling efficiency and MFU measure that contention, not the strategy "
            f"(trainer.devices <= {max(1, cores // threads)} on this host)")


# launcher=torchrun_local: a rendezvous store per attempt, hosted by that attempt's rank 0, instead
# of torchrun's one agent-hosted store for every attempt (shared by default since torch 2.4). A
# restarted attempt's ranks found the failed attempt's keys there (pytorch#135712): a rank that
# started later than its peer (imports, W&B, a loaded host) had the peer read the dead rank's gloo
# address, and the restart failed at once (connectFullMesh: Connection refused) or hung in the
# connect (5 min measured, with trainer.collective_timeout_s=60) instead of resuming. Not for
# launcher=torchrun: scalelab.same_job reads the agent's store before any rank hosts one, and its
# default static rendezvous always shares the store.
NO_SHARED_STORE = "TORCH_DISABLE_SHARE_RDZV_TCP_STORE"


def rank_env(cache_dir: Path, threads: int, job_dir: Path, verbose: bool = False,
             launcher: str = "local", max_restarts: int = 0) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k not in _LAUNCH_VARS}
    if launcher == "torchrun_local" and max_restarts > 0:   # a restart's ranks must not read the failed
        # attempt's keys (only then: the per-attempt store's free port is picked before rank 0 binds it)
        env.setdefault(NO_SHARED_STORE, "1")
    if not verbose:  # Kineto (the profiler's C++ side) logs errors only; it reads this at process start
        env["KINETO_LOG_LEVEL"] = "6"
    env.update(OMP_NUM_THREADS=str(threads), PYTHONUNBUFFERED="1",
               # DeepSpeed/torch JIT-built ops: one known folder, built once per machine.
               TORCH_EXTENSIONS_DIR=env.get("TORCH_EXTENSIONS_DIR", str(cache_dir / "torch_extensions")),
               WANDB_DIR=str(job_dir), **wandb_dirs(cache_dir), WANDB_SILENT="true", WANDB_CONSOLE="off",
               # the step line is rewritten in place only where this command's console is a terminal
               SCALELAB_CONSOLE_TTY="1" if sys.stdout.isatty() else "0")
    return env


def rank_command(launcher: str, nodes: int, devices: int, job_dir: Path, extra: list[str] = (),
                 max_restarts: int = 0, layout: dict | None = None) -> list[str]:
    worker = [sys.executable, "-m", "scalelab.worker", str(job_dir)]
    if launcher == "srun":
        # --unbuffered: the step line is live. --export=ALL: the step gets the environment this
        # process built (rank_env: MASTER_*, threads, the requeue mark), whatever the batch job's
        # export setting: srun takes sbatch's --export=NONE (or SBATCH_EXPORT=NONE, some sites'
        # default) from SLURM_EXPORT_ENV, and its ranks then had only SLURM_* variables (sbatch(1))
        # --distribution=block: node K holds tasks K*devices.. (tensor-parallel groups inside a node,
        # rank 0 on node 0); srun takes SLURM_DISTRIBUTION from the batch job, and cyclic interleaved them
        return ["srun", f"--nodes={nodes}", f"--ntasks={nodes * devices}", f"--ntasks-per-node={devices}",
                "--distribution=block", "--kill-on-bad-exit=1", "--unbuffered", "--export=ALL", *extra, *worker]
    if launcher == "torchrun":  # one node of a multi-node job (layout: torchrun_layout's, resolved)
        lay = layout or {}
        timeout = int(math.ceil(float(lay.get("timeout_s", 900))))
        # static: node K holds global ranks K*devices.. and node 0 hosts the store (rendezvous.py:
        # the only backend, so that global rank 0, the run record's writer, is on node 0)
        return [sys.executable, "-m", "torch.distributed.run", f"--nnodes={nodes}",
                f"--node-rank={lay.get('node_rank', 0)}", f"--nproc-per-node={devices}",
                "--rdzv-backend=static", f"--rdzv-endpoint={lay['endpoint']}",
                f"--rdzv-id={lay.get('rdzv_id') or 'scalelab'}", f"--rdzv-conf=timeout={timeout}",
                f"--max-restarts={max_restarts}", *extra, "-m", "scalelab.worker", str(job_dir)]
    # launcher=torchrun_local: torchrun on this machine (launcher=local forks a pre-imported
    # server instead: scalelab.spawn)
    return [sys.executable, "-m", "torch.distributed.run", "--standalone", f"--nproc_per_node={devices}",
            f"--max-restarts={max_restarts}", "-m", "scalelab.worker", str(job_dir)]


# A rank's error when a peer went away first (gloo, NCCL): a consequence of another rank's failure
# (under launcher=torchrun that peer may be on another node, where this node cannot see why).
PEER_GONE = re.compile(r"Connection (reset|closed) by peer|connection reset|Broken pipe|NCCL (remote|communicator) "
                       r"(error|was aborted)|ProcessGroup\w* .*(aborted|closed)", re.I)


# A rank's error when a collective waited out trainer.collective_timeout_s for a peer (gloo; NCCL's watchdog)
TIMED_OUT = re.compile(r"Timed out waiting \d+ms|Watchdog caught collective operation timeout|"
                       r"collective operation timeout|wait timeout after", re.I)


# A rank's error when it was ended from outside (the launcher's SIGTERM after a peer failed, Ctrl-C):
# a consequence too, whichever file is older.
ENDED = re.compile(r"SIGTERMException|KeyboardInterrupt|^SystemExit")


def hung_note(ranks: list[int], state: str) -> str:
    """'; rank R STATE when its collective timed out: ...', where the first failure is a collective's
    timeout and RANKS did not fail with one (spawn: still running; a torchrun job: wrote no error):
    the rank that timed out only waited for them."""
    who = f"rank{'s' if len(ranks) > 1 else ''} {', '.join(map(str, ranks))}"
    return f"; {who} {state} when its collective timed out: hung or slow there, look at {who} first"


def last_error_line(job_dir: Path, rank: int) -> str | None:
    """The exception line of error-rank<R>.txt (what the worker wrote as its exception left the rank)."""
    try:
        lines = [ln for ln in (job_dir / f"error-rank{rank}.txt").read_text(errors="replace").splitlines()
                 if ln.strip()]
    except OSError:
        return None
    return lines[-1] if lines else None


def cause_rank(job_dir: Path, ranks, since: float = 0.0) -> int | None:
    """Of these failed ranks, the one whose failure caused the others': a rank whose error is not a
    peer's connection ending, else any; the oldest error file first (a rank writes it as its
    exception leaves it, before its exit closes the connections its peers then fail on: ~30 ms
    earlier measured, for a rank that raised at step 3 of a 2-rank gloo job). Error files older
    than `since` (an earlier attempt's) do not count. None where none of them wrote one."""
    found = []
    for r in ranks:
        try:
            written = (job_dir / f"error-rank{r}.txt").stat().st_mtime_ns
        except OSError:
            continue
        line = last_error_line(job_dir, r)
        if written >= since * 1e9 and line is not None:
            found.append((bool(PEER_GONE.search(line) or ENDED.search(line)), written, int(r)))
    return min(found)[2] if found else None


class TracebackFilter:
    """The console's view of torchrun's output, without the Python tracebacks (torchrun's own on a
    failed rendezvous or a failed child; each failed rank's, prefixed `[rankN]:`) and C++ frame
    dumps (`Exception raised from ...`, `frame #N: ...`), nor torchrun's box of failed children
    (`ChildFailedError`, ~20 lines): a failure there printed 45-140 lines before the job's one-line
    error. Each traceback's last line (the exception) is kept; ranks.log
    keeps every line. Progress bars (`\r` without a newline) pass through as they come."""

    _PREFIX = re.compile(rb"^\[(?:default)?rank\d+\]:\s?")
    _START = (b"Traceback (most recent call last)", b"Exception raised from ")
    # a C++ stack dump's lines (c10's "Exception raised from"): its frames, and the line between
    # them where the Python frames are left out (it ended the skip: frames #39.. reached the console)
    _FRAMES = (b"frame #", b"<omitting python frames>")
    # torchrun's summary of failed children: the exception line, then a box between two rules of '='
    _BOX = b"torch.distributed.elastic.multiprocessing.errors.ChildFailedError"
    # torchrun's own log lines (glog style: `W1203 11:39:44.618000 29647 .../torch/distributed/elastic/
    # multiprocessing/api.py:1028] Sending process 29651 closing signal SIGTERM`, `E... failed (exitcode:
    # 1) local_rank: 1 ...`): how it ended its children, which the job's error line says (found by review)
    _ELASTIC_LOG = re.compile(rb"^[WEI]\d{4} [\d:.]+ +\d+ +\S*torch/distributed/elastic/\S+\] ")
    # c10d's C++ warnings while it retries a store connection (`[W1203 11:39:44.618000 29647
    # socket.cpp:764] [c10d] The IPv6 network addresses of (host, 29500) cannot be retrieved (gai
    # error: -2 ...)`): one a second until launcher.rdzv_timeout_s; each message once (its cause)
    _C10D_LOG = re.compile(rb"^\[[WEI]\d{4} [\d:.]+ +\d+ +\S+\.cpp:\d+\] ")

    def __init__(self) -> None:
        self.pending, self.skipping, self.dropped = b"", False, 0
        self.logs_dropped = 0   # torchrun's log lines (_ELASTIC_LOG) and c10d's repeated ones (_C10D_LOG)
        self.c10d_seen: set[bytes] = set()
        self.box_rules = -1   # inside the box: the '=' rules seen so far
        # where the console's line is a progress bar's (its line ends only with the run): the
        # dropped count then, to tell a traceback's exception that follows it (another rank's)
        self.bar_open: int | None = None
        self.muted = False   # mute(): the launcher ended the ranks (trainer.timeout_s)

    def mute(self) -> None:
        """The ranks' output from now on to ranks.log only, but for their own `[scalelab]` lines (a save
        at the stop: where the job goes on from): the launcher ends them (trainer.timeout_s), and each
        rank's SIGTERMException line read as a crash before the job's own 'timed out' line."""
        self.muted = True

    def feed(self, chunk: bytes) -> bytes:
        *lines, self.pending = (self.pending + chunk).split(b"\n")
        if self.muted:
            return b"".join(ln + b"\n" for ln in lines
                            if self._PREFIX.sub(b"", ln.lstrip(b"\r")).startswith(b"[scalelab]"))
        out = b""
        for ln in lines:
            shown = self._line(ln + b"\n")
            if shown:   # a traceback's exception after the bar: on a line of its own, not appended to it
                cut = self.bar_open is not None and self.dropped > self.bar_open and not shown.startswith(b"\r")
                out, self.bar_open = out + (b"\n" if cut else b"") + shown, None
        if b"\r" in self.pending:  # a progress bar's update (never a traceback's): now, not at its newline
            out, self.pending, self.skipping, self.bar_open = out + self.pending, b"", False, self.dropped
        return out

    def flush(self) -> bytes:
        if self.muted:
            return self.feed(b"\n") if self.pending else b""
        rest, self.pending = self._line(self.pending) if self.pending else b"", b""
        return rest

    def _line(self, line: bytes) -> bytes:
        body = self._PREFIX.sub(b"", line.lstrip(b"\r")).rstrip()
        if self._ELASTIC_LOG.match(body):
            self.logs_dropped += 1
            return b""
        if (c10d := self._C10D_LOG.match(body)):
            said = re.sub(rb"\d+ms|\d+ seconds", b"N", body[c10d.end():])   # (an elapsed time apart)
            if said in self.c10d_seen:
                self.logs_dropped += 1
                return b""
            self.c10d_seen.add(said)
        if body.startswith(self._BOX) or self.box_rules >= 0:
            self.box_rules += 1 if body.startswith(b"=====") or body.startswith(self._BOX) else 0
            self.box_rules = -1 if self.box_rules >= 2 else self.box_rules   # its closing rule
            self.dropped += 1
            return b""
        if body.startswith(self._START):
            self.skipping = True
        elif self.skipping and (not body or body[:1] in b" \t" or body.startswith(self._FRAMES)):
            pass
        else:
            self.skipping = False
            return line
        self.dropped += 1
        return b""


def run_ranks(cmd: list[str], env: dict[str, str], log_path: Path, timeout_s: float, on_start=None,
              console: TracebackFilter | None = None, start_by: tuple[float, str] | None = None,
              grace_s: float | None = None) -> int:
    """Run the rank launcher in its own process group, tee its output to log_path, and make
    sure nothing outlives it (timeout, Ctrl-C or an exception kill the whole group).
    on_start(proc): told the launcher's process (scalelab.requeue forwards signals to srun).
    console: what of the output the console shows (None: all of it, as ranks.log).
    start_by (seconds, why): end it when it has started no rank (scalelab.worker child) by then,
    writing `TimeoutError: why` to the log (torchrun: a rendezvous that never completes).
    grace_s: after a Ctrl-C or SIGTERM, how long the launcher and its ranks get to save and exit
    (None: the job's, stop_grace_s of log_path's folder); torchrun gives its ranks as long
    (TORCH_ELASTIC_SHUTDOWN_TIMEOUT) before its own SIGKILL, and gets KILL_WAIT_S more itself."""
    grace = stop_grace_s(log_path.parent) if grace_s is None else float(grace_s)
    if grace > KILL_WAIT_S:   # (else torchrun's default, 30 s, as before)
        env = {**env, "TORCH_ELASTIC_SHUTDOWN_TIMEOUT": env.get("TORCH_ELASTIC_SHUTDOWN_TIMEOUT")
               or str(int(math.ceil(grace)))}
    try:
        return _run_ranks(cmd, env, log_path, timeout_s, on_start, console, start_by, grace)
    finally:
        if console is not None:
            console_end(console, log_path)


_LINE_OPEN = [False]   # the ranks' output on the console ended without a newline (a progress bar's \r line)


def tee(data: bytes) -> None:
    """The ranks' output to the console, noting whether its last line is still open."""
    if data:
        sys.stdout.buffer.write(data)
        _LINE_OPEN[0] = not data.endswith(b"\n")
    sys.stdout.flush()


_LONE_CR = re.compile(rb"\r(?!\n)")


def pass_on(log, chunk: bytes, console: TracebackFilter | None) -> None:
    """A chunk of the ranks' output (both launch paths: spawn's watch, _run_ranks): to ranks.log a
    line per step update (a terminal's \r-rewritten line was one long line there), to the console
    as the filter lets it (raw \r: the bar stays live)."""
    log.write(_LONE_CR.sub(b"\n", chunk))
    tee(console.feed(chunk) if console is not None else chunk)


def end_open_line() -> None:
    """A newline where the ranks left a line open: a job's FAILED line (a timeout, a killed rank)
    was glued to the progress bar's `step 1/8 | ...`."""
    if _LINE_OPEN[0]:
        sys.stdout.write("\n")
        sys.stdout.flush()
        _LINE_OPEN[0] = False


def console_end(console: TracebackFilter, log_path: Path) -> None:
    """The filtered console's last line, and one line counting what it left out."""
    tee(console.flush())
    if console.dropped or console.logs_dropped:
        end_open_line()
        # (after a restart that succeeded: '0 traceback line(s) not shown here (and 1 of ...)')
        what = [f"{console.dropped} traceback line(s)"] if console.dropped else []
        what += [f"{console.logs_dropped} of torchrun's and c10d's log line(s)"] if console.logs_dropped else []
        sys.stdout.write(f"[scalelab] {' and '.join(what)} not shown here: {log_path} has them (verbose=true shows "
                         "them)\n")
    sys.stdout.flush()


def _started_a_rank(pid: int) -> bool:
    """Whether process `pid` has a child running scalelab.worker (True where /proc cannot tell)."""
    proc = Path("/proc")
    if not proc.is_dir():
        return True
    for d in proc.iterdir():
        if not d.name.isdigit():
            continue
        try:
            ppid = int((d / "stat").read_text().rsplit(")", 1)[1].split()[1])
            if ppid == pid and b"scalelab.worker" in (d / "cmdline").read_bytes():
                return True
        except (OSError, ValueError, IndexError):
            continue
    return False


# The rank launcher (torchrun, srun) in its own session gets SIGTERM when this process dies, even by
# SIGKILL (the OOM killer, `kill -9`), and ends its ranks: they kept training as orphans (a node of a
# multi-node run went on with the other node). Set by a tiny exec wrapper, not preexec_fn (unsafe
# in a process with threads); Linux only (prctl PR_SET_PDEATHSIG = 1), elsewhere the command as is.
_DEATHSIG = ("import ctypes, os, signal, sys; ctypes.CDLL(None).prctl(1, signal.SIGTERM); "
             "os.getppid() == int(sys.argv[1]) or os._exit(143); os.execvp(sys.argv[2], sys.argv[2:])")


def with_parent_death_signal(cmd: list[str]) -> list[str]:
    if not sys.platform.startswith("linux"):
        return list(cmd)
    return [sys.executable, "-c", _DEATHSIG, str(os.getpid()), *cmd]


def _run_ranks(cmd, env, log_path, timeout_s, on_start, console, start_by, grace: float = KILL_WAIT_S) -> int:
    cmd = with_parent_death_signal(cmd)
    with open(log_path, "ab", buffering=0) as log:  # unbuffered: the log is live while ranks run
        proc = subprocess.Popen(cmd, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                                stdin=subprocess.DEVNULL, start_new_session=True)
        if on_start is not None:
            on_start(proc)
        deadline = time.monotonic() + timeout_s
        start_deadline = time.monotonic() + start_by[0] if start_by else None
        assert proc.stdout is not None
        fd = proc.stdout.fileno()

        def pump(wait: float) -> bytes:
            ready, _, _ = select.select([fd], [], [], wait)
            chunk = os.read(fd, 65536) if ready else b""  # raw chunks keep progress bars (\r) live
            if chunk:
                pass_on(log, chunk, console)
            return chunk if chunk or not ready else None   # None: EOF

        try:
            while True:
                chunk = pump(0.5)
                if chunk is None or (not chunk and proc.poll() is not None):   # EOF, or the launcher exited
                    break                                                      # (an orphan may hold the pipe)
                if time.monotonic() > deadline:
                    raise TimeoutError(f"job exceeded trainer.timeout_s={timeout_s:g}")
                if start_deadline is not None and _started_a_rank(proc.pid):
                    start_deadline = None
                elif start_deadline is not None and time.monotonic() > start_deadline:
                    kill_group(proc)
                    log.write(f"\nTimeoutError: {start_by[1]}\n".encode())
                    return 1
            return proc.wait()
        except BaseException as e:
            if isinstance(e, KeyboardInterrupt):   # Ctrl-C, or SIGTERM (scalelab.train): the ranks may save first
                stopping_line(grace)
                if grace > KILL_WAIT_S:   # torchrun's own SIGKILL comes at `grace`; the save lines to the log
                    kill_group(proc, grace + KILL_WAIT_S, pump, stopping=True)
                else:
                    kill_group(proc)
            else:
                kill_group(proc)
            if isinstance(e, TimeoutError):
                log.write(f"\n{e}\n".encode())
                return 124
            raise
        finally:
            kill_group(proc)  # ranks orphaned by a crashed torchrun must not linger

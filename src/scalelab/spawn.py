"""Start a local job's ranks as forks of a pre-imported server (`launcher=local`).

Why: a 2-rank gpt_nano job spent ~9 s of its ~20 s importing (torch, Lightning, datasets) in each
rank, and ~1 s in torchrun's own start, before the first step (run.json timing.phases_s).
Python's multiprocessing forkserver imports the worker's modules once, in a server process the
command starts first thing (so the import overlaps with preflight), and forks every rank from it:
each rank is still a fresh process (no state passes between jobs of a sweep: every fork starts
from the server's just-imported state), but it pays no import. The server lives for the whole
command, so a sweep's jobs run back to back without paying it again.

What torchrun did that this keeps: each rank gets RANK / LOCAL_RANK / WORLD_SIZE /
LOCAL_WORLD_SIZE / GROUP_RANK / MASTER_ADDR / MASTER_PORT (Lightning reads them as a
TorchElasticEnvironment and launches nothing), one rank dying ends its peers (the job's result is
the first failure), a timeout kills them all, and the ranks' output is teed live to the console
and ranks.log. Each rank is a session leader: killing its process group also ends anything it
started (DataLoader workers).
"""
from __future__ import annotations

import multiprocessing as mp
import os
import re
import select
import signal
import sys
import time
from pathlib import Path
from typing import Callable

from scalelab import launch
from scalelab.checkpointing import PROGRESS, RESUMED, read_mark
from scalelab.requeue import STOPPED_EXIT

PRELOAD = ["scalelab.fork_guard", "scalelab.worker"]   # the guard first: it dies with the command
# The line the watch loop writes to ranks.log when a rank dies first (its peers are ended after it):
# (rank, how), read back for a restart's console line and for the job's error (scalelab.train).
FAILED_FIRST = re.compile(r"\[scalelab\] rank (\d+) failed first \(([^)]*)\)")
# The server forks with one thread (a fork copies only the calling thread; a library pool caught
# mid-operation would be left half-held in the child). Importing the worker starts numpy's
# OpenBLAS pool and pyarrow's jemalloc background thread unless told not to; every rank sets its
# own torch threads after the fork (worker: torch.set_num_threads). The ddp_powersgd heap
# corruption once blamed on forking was not fork-related (torchrun ranks aborted alike): see
# scaling/breakdown.py _drain_collectives.
SERVER_ENV = {"OPENBLAS_NUM_THREADS": "1", "OMP_NUM_THREADS": "1", "MKL_NUM_THREADS": "1",
              "JE_ARROW_MALLOC_CONF": "background_thread:false"}
_CTX = None


def start_server(env: dict[str, str] | None = None) -> None:
    """Start the fork server now (it imports PRELOAD in the background while the caller goes on);
    again, with this environment, where it died (an OOM kill: multiprocessing would start a new
    one on the next rank's start without SERVER_ENV and fork_guard's death signal)."""
    global _CTX
    if _CTX is None:
        _CTX = mp.get_context("forkserver")
        _CTX.set_forkserver_preload(PRELOAD)
    saved = dict(os.environ)
    try:  # the server's own environment: what every rank starts from, before its rank variables
        os.environ.update({**(env or {}), **SERVER_ENV, "SCALELAB_FORK_SERVER": "1",
                           "SCALELAB_LAUNCHER_PID": str(os.getpid())})
        from multiprocessing import forkserver
        forkserver.ensure_running()   # a no-op while it runs (a waitpid: no restart, no imports)
    finally:
        os.environ.clear()
        os.environ.update(saved)


def stop_server() -> None:
    """End the fork server now: a command that stops before any rank (the server may still be
    importing and would linger until done), or one that is finished (the server would hold the
    command's stdout open through its own interpreter teardown, ~1 s, for whoever reads it)."""
    from multiprocessing import forkserver

    pid = getattr(forkserver._forkserver, "_forkserver_pid", None)
    if _CTX is not None and pid:
        try:
            os.kill(pid, signal.SIGKILL)
        except ProcessLookupError:
            pass


def _rank_main(job_dir: str, env: dict[str, str], out_path: str) -> None:
    """A rank, in its forked process: its own session, environment and output, then the worker."""
    os.setsid()
    # it ends with the fork server, which ends with the command (scalelab.fork_guard): SIGTERM, as a
    # stop (a job that checkpoints saves at an agreed step first); torchrun_local's ranks get the same
    server = os.environ.get("SCALELAB_FORK_SERVER_PID")
    if sys.platform.startswith("linux"):
        import ctypes

        ctypes.CDLL(None).prctl(1, ctypes.c_ulong(signal.SIGTERM))   # PR_SET_PDEATHSIG
        if server and os.getppid() != int(server):   # the server died before the line above
            os._exit(143)
    signal.signal(signal.SIGINT, signal.default_int_handler)   # the server ignores it (fork_guard); a rank not
    # ps and /proc/PID/cmdline name the job and the rank, not the fork server. Before the
    # environment is replaced: setproctitle needs the process's original environ block.
    try:  # a nicety: a host without it (a GPU image with no registry access) still runs the ranks
        import setproctitle

        setproctitle.setproctitle(f"{sys.executable} -m scalelab.worker {job_dir} (rank {env['RANK']}, forked)")
    except ImportError:
        pass
    os.environ.clear()
    os.environ.update(env)
    fd = os.open(out_path, os.O_WRONLY)
    os.dup2(fd, 1)
    os.dup2(fd, 2)
    os.close(fd)
    if server:
        _watch_orphaning(int(server), Path(job_dir), out_path)
    from scalelab import worker

    sys.exit(worker.rank_entry(Path(job_dir)))


def _watch_orphaning(server: int, job_dir: Path, pipe: str) -> None:
    """When the command is gone (its fork server died with it: the rank's parent changes), this
    rank's output goes to ranks.log (the pipe to the console has no reader: a write raised
    BrokenPipeError, and a saving rank could die of its progress bar), and after the stop grace
    (a checkpointing job saves on its SIGTERM meanwhile) the rank's group is killed: a rank stuck in
    a collective or hung never acts on the SIGTERM, and nothing else would end it. The rank keeps a
    reader on the pipe until then, so a write never fails before the switch."""
    import threading

    reader = os.open(pipe, os.O_RDONLY | os.O_NONBLOCK)

    def watch() -> None:
        while os.getppid() == server:
            time.sleep(0.5)
        try:
            log = os.open(job_dir / "ranks.log", os.O_WRONLY | os.O_APPEND)
            os.dup2(log, 1)
            os.dup2(log, 2)
            os.close(log)
            os.close(reader)
        except OSError:
            pass
        time.sleep(launch.stop_grace_s(job_dir) + launch.KILL_WAIT_S)
        os.killpg(os.getpid(), signal.SIGKILL)   # a session leader: its DataLoader workers too

    threading.Thread(target=watch, name="scalelab-orphan-watch", daemon=True).start()


def run_job(job_dir: Path, n: int, env: dict[str, str], log_path: Path, timeout_s: float,
            max_restarts: int, goes_on: Callable[[], str], tracebacks: bool = False) -> tuple[int, dict]:
    """Run the job's n ranks; when one fails and restarts remain, end them all and start them
    again (elastic restart: they resume by themselves, checkpoint.resume=auto). goes_on(): where
    they go on from, for the restart line (checkpointing.goes_on_from). tracebacks: the console
    shows the ranks' tracebacks too (verbose=true; ranks.log always has them). Returns (exit code,
    {"restarts", "steps_redone"})."""
    deadline = time.monotonic() + timeout_s
    restarts = redone = failed_at = 0
    while True:
        (job_dir / PROGRESS).unlink(missing_ok=True)
        (job_dir / RESUMED).unlink(missing_ok=True)
        code = run_ranks(job_dir, n, env, log_path, max(1.0, deadline - time.monotonic()), tracebacks)
        if restarts:                       # steps this attempt did again: from its resume point
            redone += max(0, failed_at - read_mark(job_dir / RESUMED, 0))
        if code in (0, 124) or restarts >= max_restarts:
            return code, {"restarts": restarts, "steps_redone": redone}
        failed_at = read_mark(job_dir / PROGRESS, 0)
        restarts += 1
        line = f"[scalelab] restart {restarts} of {max_restarts} after step {failed_at}: every rank starts again " \
               f"and will {goes_on()}"
        with open(log_path, "ab") as log:
            log.write(f"{line}\n".encode())
        launch.end_open_line()   # after a progress bar's open line
        print(f"{line}{_why(log_path)}", flush=True)


def _why(log_path: Path) -> str:
    """'; rank R failed first (...)': the failure that caused a restart, from ranks.log (the console
    showed the restart, not its cause)."""
    try:
        found = FAILED_FIRST.findall(log_path.read_text(errors="replace"))
    except OSError:
        return ""
    return f"; rank {found[-1][0]} failed first ({found[-1][1]})" if found else ""


def run_ranks(job_dir: Path, n: int, env: dict[str, str], log_path: Path, timeout_s: float,
              tracebacks: bool = False) -> int:
    """Run n ranks of the job in job_dir; tee their output to log_path and stdout (without
    tracebacks unless `tracebacks`: launch.TracebackFilter). The exit code: 0 when every rank
    exits 0, else the first failure's (negative: killed by that signal; 124: timed out)."""
    start_server(env)
    fifo = job_dir / ".ranks.pipe"
    fifo.unlink(missing_ok=True)
    os.mkfifo(fifo)
    read_fd = os.open(fifo, os.O_RDONLY | os.O_NONBLOCK)
    keep_open = os.open(fifo, os.O_WRONLY)  # EOF only once the launcher says so (after the ranks)
    port = str(launch.free_port())
    started = time.time()   # error files older than this are an earlier attempt's
    grace = launch.stop_grace_s(job_dir)   # after a Ctrl-C or SIGTERM: the ranks' save (scalelab.requeue)
    console = None if tracebacks else launch.TracebackFilter()
    procs = []
    try:
        for r in range(n):
            renv = {**env, "RANK": str(r), "LOCAL_RANK": str(r), "WORLD_SIZE": str(n), "LOCAL_WORLD_SIZE": str(n),
                    "GROUP_RANK": "0", "ROLE_RANK": str(r), "ROLE_WORLD_SIZE": str(n),
                    "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": port}
            p = _CTX.Process(target=_rank_main, args=(str(job_dir), renv, str(fifo)), name=f"rank{r}")
            p.start()
            procs.append(p)
        return _watch(procs, read_fd, keep_open, log_path, time.monotonic() + timeout_s, console,
                      lambda failed: launch.cause_rank(job_dir, failed, since=started), grace)
    finally:
        _stop(procs)   # anything left (an exception before the watch)
        os.close(read_fd)
        fifo.unlink(missing_ok=True)
        if console is not None:
            launch.console_end(console, log_path)


def _watch(procs, read_fd: int, keep_open: int, log_path: Path, deadline: float, console, cause,
           grace: float = launch.KILL_WAIT_S) -> int:
    """grace: after a Ctrl-C or SIGTERM (KeyboardInterrupt here), how long the ranks get to save
    and exit (launch.stop_grace_s); a peer's failure or the timeout gives them launch.KILL_WAIT_S."""
    code = 0
    with open(log_path, "ab", buffering=0) as log:
        def pump(wait: float) -> bool:
            ready, _, _ = select.select([read_fd], [], [], wait)
            chunk = os.read(read_fd, 65536) if ready else b""
            if chunk:
                launch.pass_on(log, chunk, console)
            return bool(chunk)

        try:
            while any(p.exitcode is None for p in procs):
                pump(0.2)
                failed = [(i, p.exitcode) for i, p in enumerate(procs) if p.exitcode not in (None, 0)]
                if failed and not code:
                    # a dead rank ends its peers (as torchrun does)
                    rank, code = _first_failure(procs, failed, pump, cause)
                    how = (f"killed by signal {-code}" if code < 0 else f"exit code {code}"
                           + (", saved and stopped on SIGTERM" if code == STOPPED_EXIT else ""))
                    how += _hung_peers(log_path.parent, rank, procs)   # ranks.log is in the job folder
                    log.write(f"\n[scalelab] rank {rank} failed first ({how}); ending the other ranks\n".encode())
                    _stop(procs, launch.KILL_WAIT_S, pump)
                if time.monotonic() > deadline:
                    if console is not None:   # the job's 'timed out' line says it; the ranks' ends go to ranks.log
                        console.mute()
                    _stop(procs, launch.KILL_WAIT_S, pump)
                    log.write(b"\njob exceeded trainer.timeout_s\n")
                    code = 124
        except KeyboardInterrupt:   # Ctrl-C, or SIGTERM (scalelab.train): the ranks save at their next step first
            launch.stopping_line(grace)
            # their save lines to the console and ranks.log; with nothing to save, their ends unshown as before
            _stop(procs, grace, pump if grace > launch.KILL_WAIT_S else None, stopping=True)
            raise
        os.close(keep_open)
        while pump(0.05):                         # what the ranks wrote last
            pass
    return code or next((p.exitcode for p in procs if p.exitcode), 0)


def _hung_peers(job_dir: Path, rank: int, procs) -> str:
    """'; rank R still running ...' where the first failure is a collective's timeout and peers
    still run: the rank that timed out only waited for them. A rank hung at step 3 was reported as
    its healthy peer's failure ("rank 0 failed first: ... Timed out waiting 8000ms for recv")."""
    alive = [i for i, p in enumerate(procs) if p.exitcode is None and i != rank]
    if not alive or not launch.TIMED_OUT.search(launch.last_error_line(job_dir, rank) or ""):
        return ""
    return launch.hung_note(alive, "still running")


def _first_failure(procs, failed: list[tuple[int, int]], pump, cause, grace_s: float = 1.0) -> tuple[int, int]:
    """The rank whose failure came first. A rank killed by a signal (the OOM killer, a SIGKILL)
    makes its peers fail next with "connection reset" errors, and the fork server may report the
    peers' exits before its own: so a rank that exited with an error code waits up to `grace_s`
    for a signal death among the others, which is then named as the cause. Among ranks that
    exited with an error, cause(ranks) names the one whose error came first (launch.cause_rank:
    a rank that raised, not a peer that lost its connection to it next; the fork server reports
    both exits at once, lowest rank first)."""
    end = time.monotonic() + grace_s
    while True:
        killed = [(i, c) for i, c in failed if c < 0]
        if killed:
            return killed[0]
        if time.monotonic() > end or all(p.exitcode is not None for p in procs):
            first = cause([i for i, _ in failed])
            return next((f for f in failed if f[0] == first), failed[0])
        pump(0.05)
        failed = [(i, p.exitcode) for i, p in enumerate(procs) if p.exitcode not in (None, 0)]


def _stop(procs, grace: float = launch.KILL_WAIT_S, pump=None, stopping: bool = False) -> None:
    """End the ranks still running: SIGTERM to each rank (a job that checkpoints saves at its next
    step on it: scalelab.requeue), up to `grace` s for all of them at once (pumping their output),
    then SIGKILL to the group of any rank left (the rank is its session's leader: its DataLoader
    workers too). The SIGTERM goes to the rank alone, not its group: a DataLoader worker or the
    W&B service ended under a rank that is saving failed its save. What an exited rank left in its
    group gets SIGTERM. Before, each rank in turn had SIGTERM and 5 s: a save needs every rank.
    stopping: for a Ctrl-C or SIGTERM, where another one ends the wait at once."""
    live = [p for p in procs if p.exitcode is None and p.pid is not None]
    for p in live:
        try:
            os.kill(p.pid, signal.SIGTERM)
        except (ProcessLookupError, PermissionError):
            pass
    # while they save: a rank that died or failed (not a save's exit) ends the wait, the others cannot
    # save without it (a Ctrl-C while the ranks start: the started ones would wait out the grace)
    saving = grace > launch.KILL_WAIT_S
    launch.wait_for(lambda: all(p.exitcode is not None for p in live) or (
        saving and any(p.exitcode not in (None, 0, STOPPED_EXIT) for p in live)), grace, pump, stopping)
    for p in live:
        try:
            os.killpg(p.pid, signal.SIGKILL if p.exitcode is None else signal.SIGTERM)
        except (ProcessLookupError, PermissionError):
            continue
        p.join(timeout=launch.KILL_WAIT_S)

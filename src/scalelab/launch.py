"""Start one job's ranks as fresh processes: torchrun locally, srun under SLURM.

Hydra never runs inside a rank (Lightning's own re-launch re-runs sys.argv, which under
`-m` starts a nested sweep; see shared/notes/cpu-strategies.md section 2). Each rank runs
`python -m scalelab.worker JOB_DIR`, reading the resolved config the job saved there.
"""
from __future__ import annotations

import os
import select
import signal
import subprocess
import sys
import time
from pathlib import Path

# Variables that would make the ranks think they are already inside another launch.
_LAUNCH_VARS = ("LOCAL_RANK", "RANK", "WORLD_SIZE", "LOCAL_WORLD_SIZE", "GROUP_RANK", "ROLE_RANK",
                "ROLE_WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT", "NODE_RANK", "PL_GLOBAL_SEED",
                "PL_TRAINER_GPUS", "PL_EXP_VERSION", "TORCHELASTIC_RUN_ID", "TORCHELASTIC_RESTART_COUNT",
                "TORCHELASTIC_MAX_RESTARTS", "TORCHELASTIC_USE_AGENT_STORE", "TORCH_NCCL_ASYNC_ERROR_HANDLING",
                "OMP_NUM_THREADS")


def threads_per_rank(requested, ranks_per_node: int, accelerator: str = "cpu") -> int:
    """CPU threads (torch intra-op, OMP) per rank. `null` (the default): 1 on CPU, where a
    "device" is a rank of one thread, and cores / ranks on GPU, where the host threads feed the
    device (data, optimizer on host, model init) and 1 thread starves them. `auto`: cores / ranks."""
    if requested not in (None, "auto"):
        return max(1, int(requested))
    if requested is None and accelerator == "cpu":
        return 1
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1
    return max(1, cores // ranks_per_node)


def rank_env(cache_dir: Path, threads: int, job_dir: Path, verbose: bool = False) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k not in _LAUNCH_VARS}
    if not verbose:  # Kineto (the profiler's C++ side) logs errors only; it reads this at process start
        env["KINETO_LOG_LEVEL"] = "6"
    env.update(OMP_NUM_THREADS=str(threads), PYTHONUNBUFFERED="1",
               # DeepSpeed/torch JIT-built ops: one known folder, built once per machine.
               TORCH_EXTENSIONS_DIR=env.get("TORCH_EXTENSIONS_DIR", str(cache_dir / "torch_extensions")),
               WANDB_DIR=str(job_dir), WANDB_CACHE_DIR=str(cache_dir / "wandb-cache"),
               WANDB_CONFIG_DIR=str(cache_dir / "wandb-config"), WANDB_DATA_DIR=str(cache_dir / "wandb-data"),
               WANDB_SILENT="true", WANDB_CONSOLE="off")
    return env


def rank_command(launcher: str, nodes: int, devices: int, job_dir: Path, extra: list[str] = (),
                 max_restarts: int = 0) -> list[str]:
    worker = [sys.executable, "-m", "scalelab.worker", str(job_dir)]
    if launcher == "srun":
        return ["srun", f"--nodes={nodes}", f"--ntasks={nodes * devices}", f"--ntasks-per-node={devices}",
                "--kill-on-bad-exit=1", *extra, *worker]
    # launcher=torchrun_local: torchrun on this machine (launcher=local forks a pre-imported
    # server instead: scalelab.spawn)
    return [sys.executable, "-m", "torch.distributed.run", "--standalone", f"--nproc_per_node={devices}",
            f"--max-restarts={max_restarts}", "-m", "scalelab.worker", str(job_dir)]


def run_ranks(cmd: list[str], env: dict[str, str], log_path: Path, timeout_s: float) -> int:
    """Run the rank launcher in its own process group, tee its output to log_path, and make
    sure nothing outlives it (timeout, Ctrl-C or an exception kill the whole group)."""
    with open(log_path, "ab", buffering=0) as log:  # unbuffered: the log is live while ranks run
        proc = subprocess.Popen(cmd, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                                stdin=subprocess.DEVNULL, start_new_session=True)
        deadline = time.monotonic() + timeout_s
        try:
            assert proc.stdout is not None
            fd = proc.stdout.fileno()
            while True:
                ready, _, _ = select.select([fd], [], [], 0.5)
                chunk = os.read(fd, 65536) if ready else b""  # raw chunks keep progress bars (\r) live
                if chunk:
                    log.write(chunk)
                    sys.stdout.buffer.write(chunk)
                    sys.stdout.flush()
                elif ready or proc.poll() is not None:  # EOF, or the launcher exited (an orphan may hold the pipe)
                    break
                if time.monotonic() > deadline:
                    raise TimeoutError(f"job exceeded trainer.timeout_s={timeout_s:g}")
            return proc.wait()
        except BaseException as e:
            _kill_group(proc)
            if isinstance(e, TimeoutError):
                log.write(f"\n{e}\n".encode())
                return 124
            raise
        finally:
            _kill_group(proc)  # ranks orphaned by a crashed torchrun must not linger


def _kill_group(proc: subprocess.Popen) -> None:
    try:
        pgid = os.getpgid(proc.pid)
    except ProcessLookupError:
        pgid = proc.pid  # leader gone; its group may still hold ranks
    for sig in (signal.SIGTERM, signal.SIGKILL):
        try:
            os.killpg(pgid, sig)
        except (ProcessLookupError, PermissionError):
            return
        try:
            proc.wait(timeout=5)
        except subprocess.TimeoutExpired:
            continue
        time.sleep(0.2)

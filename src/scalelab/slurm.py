"""`scalelab slurm render|submit`: an sbatch script for one run (multi-node via srun).

For sweeps on SLURM use Hydra's submitit launcher: each sweep job becomes one SLURM job whose
batch step runs the Hydra job, which starts its ranks with srun (see slurm/README.md)."""
from __future__ import annotations

import argparse
import shlex
import subprocess
import sys
from pathlib import Path

from scalelab.paths import REPO_ROOT, cache_dir

TEMPLATE = REPO_ROOT / "slurm" / "run.sbatch.template"


def render(nodes: int, devices: int, overrides: list[str], gpus: bool, time: str, partition: str | None,
           cpus_per_task: int, job_name: str, log_dir: str) -> str:
    return TEMPLATE.read_text().format(
        job_name=job_name, nodes=nodes, devices=devices, cpus_per_task=cpus_per_task,
        gpu_line=f"#SBATCH --gpus-per-node={devices}\n" if gpus else "", time=time,
        partition_line=f"#SBATCH --partition={partition}\n" if partition else "", log_dir=log_dir,
        workdir=shlex.quote(str(Path.cwd())), cache=shlex.quote(str(cache_dir())),
        python=shlex.quote(sys.executable), overrides=" ".join(shlex.quote(o) for o in overrides)).rstrip() + "\n"


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("action", choices=["render", "submit"])
    p.add_argument("--nodes", type=int, default=1)
    p.add_argument("--devices", type=int, default=1, help="ranks (GPUs) per node")
    p.add_argument("--cpu", action="store_true", help="no GPUs (gloo ranks on CPU cores)")
    p.add_argument("--time", default="01:00:00")
    p.add_argument("--partition")
    p.add_argument("--cpus-per-task", type=int, default=8)
    p.add_argument("--job-name", default="scalelab")
    p.add_argument("--log-dir", default="outputs/slurm")
    p.add_argument("--out", help="write the script here (render) instead of stdout")
    p.add_argument("overrides", nargs="*", help="scalelab-train overrides, e.g. strategy=fsdp model=gpt_small")


def run(args: argparse.Namespace) -> int:
    from scalelab.errors import ConfigError
    from scalelab.preflight import preflight

    if args.nodes < 1 or args.devices < 1:
        print(f"error: --nodes={args.nodes} --devices={args.devices}: both must be >= 1", file=sys.stderr)
        return 2
    overrides = [o for o in args.overrides if not o.startswith(("trainer.devices=", "trainer.num_nodes="))]
    try:  # the same validation as a local run, for the SLURM layout
        # (GPU count is not checked here: the login node may have none.)
        preflight([*overrides, "launcher=srun", f"trainer.devices={args.devices}", f"trainer.num_nodes={args.nodes}",
                   *(["trainer.accelerator=cpu"] if args.cpu else [])])
    except ConfigError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    script = render(args.nodes, args.devices, overrides, not args.cpu, args.time, args.partition,
                    args.cpus_per_task, args.job_name, args.log_dir)
    if args.action == "render":
        if args.out:
            Path(args.out).write_text(script)
            print(f"wrote {args.out}")
        else:
            print(script, end="")
        return 0
    Path(args.log_dir).mkdir(parents=True, exist_ok=True)
    return subprocess.run(["sbatch"], input=script, text=True).returncode

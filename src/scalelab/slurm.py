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
    p.add_argument("--nodes", type=int, help="nodes (default: trainer.num_nodes=N among the overrides, else 1)")
    p.add_argument("--devices", type=int, help="ranks (GPUs) per node (default: trainer.devices=N among the "
                                              "overrides, else 1)")
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

    try:
        nodes = _layout(args.nodes, args.overrides, "trainer.num_nodes", "--nodes")
        devices = _layout(args.devices, args.overrides, "trainer.devices", "--devices")
    except ValueError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    args.nodes, args.devices = nodes, devices
    overrides = [o for o in args.overrides if not o.startswith(("trainer.devices=", "trainer.num_nodes="))]
    try:  # the same validation as a local run, for the SLURM layout
        # (GPU count is not checked here: the login node may have none.)
        # No data preparation here: the batch job prepares it on the cluster.
        preflight([*overrides, "launcher=srun", f"trainer.devices={args.devices}", f"trainer.num_nodes={args.nodes}",
                   *(["trainer.accelerator=cpu"] if args.cpu else [])], data=False)
    except ConfigError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    script = render(args.nodes, args.devices, overrides, not args.cpu, args.time, args.partition,
                    args.cpus_per_task, args.job_name, args.log_dir)
    Path(args.log_dir).mkdir(parents=True, exist_ok=True)  # sbatch does not create --output's folder
    if args.action == "render":
        if args.out:
            Path(args.out).write_text(script)
            print(f"wrote {args.out}")
        else:
            print(script, end="")
        return 0
    return subprocess.run(["sbatch"], input=script, text=True).returncode


def _layout(flag: int | None, overrides: list[str], key: str, name: str) -> int:
    """One source of truth for the SLURM layout: the flag, or the trainer override, and the two
    must agree when both are given (a dropped override would run another job than asked)."""
    given = [o.split("=", 1)[1] for o in overrides if o.startswith(key + "=")]
    value = flag
    if given:
        try:
            override = int(given[-1])
        except ValueError:
            raise ValueError(f"{key}={given[-1]!r} must be an integer >= 1") from None
        if flag is not None and flag != override:
            raise ValueError(f"{name} {flag} and {key}={override} disagree: give one of them")
        value = override
    value = 1 if value is None else value
    if value < 1:
        raise ValueError(f"{name} / {key} = {value}: must be >= 1")
    return value

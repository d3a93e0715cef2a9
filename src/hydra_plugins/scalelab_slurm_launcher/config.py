"""`hydra/launcher=slurm`'s settings, registered with Hydra's ConfigStore when Hydra scans its
plugins (as hydra-submitit-launcher registers `submitit_slurm`): a typed schema, so a misspelt or
mistyped `hydra.launcher.KEY=...` is refused before anything is submitted."""
from dataclasses import dataclass, field
from typing import Any, List, Optional

from hydra.core.config_store import ConfigStore


@dataclass
class ScalelabSlurmConf:
    _target_: str = "hydra_plugins.scalelab_slurm_launcher.launcher.ScalelabSlurmLauncher"
    partition: Optional[str] = None
    time: str = "01:00:00"               # per job (sbatch --time)
    cpus_per_task: Optional[int] = None  # per rank; None: 1 with trainer.accelerator=cpu, else 8
    gpus_per_node: Any = "auto"          # auto: trainer.devices unless trainer.accelerator=cpu; or a number
    gres: bool = False                   # ask for them as --gres=gpu:N (sites without select/cons_tres)
    account: Optional[str] = None
    qos: Optional[str] = None
    setup: List[str] = field(default_factory=list)  # shell lines before the job: ["module load cuda/12.4"]
    signal_delay_s: int = 90             # USR1 this long before the time limit: save, requeue, resume
    job_name: str = "scalelab"
    poll_s: float = 1.0                  # how often the command asks SLURM (squeue, sacct) while it waits


ConfigStore.instance().store(group="hydra/launcher", name="slurm", node=ScalelabSlurmConf, provider="scalelab")

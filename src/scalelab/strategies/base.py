"""What every strategy module provides. A strategy turns a plain model into a distributed one;
the model itself never knows about ranks.

Registry: a strategy is one module here plus one yaml in conf/strategy/ whose `_target_`
names its StrategyPlan subclass. The valid names are the yaml files (see registry.py).
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch
from torch import nn

from scalelab.errors import ConfigError
from scalelab.scaling.batch import BatchPlan


@dataclass(frozen=True)
class RunSpec:
    """What a strategy needs to know about the job to validate and build itself."""

    world_size: int
    num_nodes: int
    devices_per_node: int
    accelerator: str  # "cpu" | "gpu"
    precision: str
    model_arch: Any  # the model's config dataclass (GPTConfig, MLPConfig)
    batch: BatchPlan | None = None


def local_bytes(t: torch.Tensor | None) -> int:
    """Bytes this rank actually holds for t (a DTensor counts its local shard only)."""
    if t is None:
        return 0
    if hasattr(t, "to_local"):
        t = t.to_local()
    return t.numel() * t.element_size()


def full_tensors(net: nn.Module, keep: bool) -> dict[str, torch.Tensor]:
    """`net`'s state_dict with every DTensor gathered whole (full_tensor: a collective, so every
    rank calls this), one tensor at a time; copied to the host only where `keep` (the rank that
    writes or sends them: every rank's fp32 copy of the whole model was 8 x the model in one
    node's RAM)."""
    state = {}
    for k, v in net.state_dict().items():
        full = v.full_tensor() if hasattr(v, "full_tensor") else v
        if keep:
            state[k] = full.detach().cpu()
    return state


def without_teardown_copies(strategy: Any) -> Any:
    """Fixes: a 1.2B GPT trained by `single` on one GPU peaked at 20.2 GB of host RSS (FSDP: 6.2 GB).
    Lightning's Strategy.teardown (single, DDP, DeepSpeed; ModelParallelStrategy skips it) copies
    the optimizer state and the model to host memory at the end of fit: 12 bytes per parameter
    with Adam in fp32, per rank, for a process that is about to exit; checkpoints and exports after
    fit run where the states are. Teardown here releases everything else as before, without
    those two copies (LitModule.cpu() honours `keep_on_device`)."""
    if isinstance(strategy, str) or not hasattr(strategy, "teardown"):
        return strategy
    inner = strategy.teardown

    def teardown() -> None:
        module, optimizers = strategy.lightning_module, strategy.optimizers
        strategy.optimizers = []               # nothing for _optimizers_to_device to move
        if module is not None:
            module.keep_on_device = True
        try:
            inner()
        finally:
            strategy.optimizers = optimizers
            if module is not None:
                module.keep_on_device = False

    strategy.teardown = teardown
    return strategy


class StrategyPlan:
    """Base class. Subclasses are built by Hydra from conf/strategy/<name>.yaml."""

    name: str = "base"
    #: 1 when the strategy only runs on one device (validated before spawn)
    max_world_size: int | None = None
    #: every rank holds the whole model on its device (single, DDP, ZeRO-1/2): on a GPU the model
    #: is then built there directly, with no fp32 copy of it in host memory per rank.
    replicates_model: bool = False
    #: the plain model is built on the meta device and the strategy cuts it in `parallelize`;
    #: LitModule.configure_model then allocates and fills only what this rank kept
    #: (strategies.materialize; FSDP, TP, fsdp_tp, nd, pipeline). ZeRO-3 rebuilds it under
    #: deepspeed.zero.Init in its parallelize instead. No rank ever holds the whole model.
    meta_init: bool = False
    #: trainer.gradient_clip_val is applied by the strategy (DeepSpeed's engine; a pipeline's plan,
    #: across stages), not by Lightning's precision plugin, whose mixed precision cannot clip for a
    #: fused optimizer (config.validate refuses that pair where Lightning would clip)
    clips_gradients_itself: bool = False
    #: each rank's optimizer steps on its own shard's gradient alone (single at N > 1): the LR rule
    #: scales by that batch, global / N, not by the global batch no one optimizer sees
    independent_replicas: bool = False

    def __init__(self, name: str | None = None, **options: Any):
        if name:
            self.name = name
        if options:
            raise ConfigError(f"strategy {self.name}: unknown option(s) {sorted(options)}")

    # -- before any rank starts ------------------------------------------------------------
    def validate(self, run: RunSpec) -> None:
        if self.max_world_size is not None and run.world_size > self.max_world_size:
            raise ConfigError(f"strategy={self.name} runs on at most {self.max_world_size} device(s); "
                              f"got world size {run.world_size}")

    def resume_note(self, world_size: int) -> str | None:
        """Why a resume from a checkpoint does not continue the run exactly (state the checkpoint
        does not hold), or None: it does (run.json `resume_inexact`, a warning at the resume)."""
        return None

    def parallel_degrees(self, world_size: int) -> dict[str, int]:
        """Data-, tensor- and pipeline-parallel degrees; dp x tp x pp == world size."""
        return {"dp": world_size, "tp": 1, "pp": 1}

    # -- inside a rank -----------------------------------------------------------------------
    def dp_rank(self, global_rank: int, world_size: int) -> int:
        return global_rank

    def init_device(self, run: RunSpec, local_rank: int) -> torch.device:
        """Where this rank builds the plain model (see replicates_model and meta_init)."""
        if run.accelerator == "gpu" and self.replicates_model:
            return torch.device("cuda", local_rank)
        if self.meta_init:
            from scalelab.strategies.materialize import supports_meta_init

            if supports_meta_init(run.model_arch):
                return torch.device("meta")
        return torch.device("cpu")

    def lightning_strategy(self, run: RunSpec) -> Any:
        """A Lightning Strategy instance (or registry name) for Trainer(strategy=...)."""
        raise NotImplementedError

    def parallelize(self, net: nn.Module, device_mesh: Any) -> nn.Module:
        """Hook for strategies applied in LightningModule.configure_model (FSDP2, TP)."""
        return net

    def loss_ranks(self, world_size: int) -> list[int] | None:
        """Ranks whose loss is the model's loss (None: all; a pipeline: its last stage)."""
        return None

    # Optional: def training_step(self, pl_module, batch, batch_idx) -> dict
    # replaces LitModule's forward/backward (pipeline schedules run both themselves).

    def state_bytes(self, trainer: Any, pl_module: Any) -> dict[str, int]:
        """Bytes of parameters and optimizer state this rank holds (after an optimizer step)."""
        params = sum(local_bytes(p) for p in pl_module.net.parameters())
        opt = sum(local_bytes(v) for o in trainer.optimizers for st in o.state.values()
                  for v in st.values() if isinstance(v, torch.Tensor) and v.dim() > 0)
        return {"params": params, "optimizer": opt}

    def grad_bytes(self, trainer: Any, pl_module: Any) -> int:
        """Bytes of gradients this rank holds (called just before the optimizer step)."""
        return sum(local_bytes(p.grad) for p in pl_module.net.parameters())

    def rank_metrics(self) -> Any:
        """Strategy-specific measurements of this rank, gathered to rank 0 after fit (None: none)."""
        return None

    def record_fields(self, per_rank: list[Any], warmup_steps: int, profiled_steps: int = 0) -> dict:
        """Extra run.json entries built on rank 0 from every rank's rank_metrics(), in rank order
        (e.g. a pipeline's measured bubble). Steady state: skip the first warmup_steps and the
        last profiled_steps steps."""
        return {}

    def consolidated_state_dict(self, trainer: Any, pl_module: Any) -> dict | None:
        """The plain model's full state_dict on rank 0 (None elsewhere). Collective: every
        rank calls it. Sharded strategies gather their shards here."""
        rank0 = trainer.global_rank == 0
        state = full_tensors(pl_module.net, keep=rank0)
        return state if rank0 else None

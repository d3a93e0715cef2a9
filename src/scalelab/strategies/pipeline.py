"""`pipeline`: pipeline parallelism with torch.distributed.pipelining (GPipe, 1F1B, interleaved 1F1B).

The GPT's layers are split into `pp` contiguous stages (`split`: equal layer counts or equal
modelled FLOPs, pipeline_split.py); stage 0 also holds the embeddings, the last stage the final
norm and the LM head. With `stages_per_rank` v > 1 (schedule interleaved_1f1b, Narayanan et al.
2021 Sec. 2.2.2: bubble (p-1)/(v m)) the layers are split into p x v virtual stages and rank r
runs stages r, r + p, ..., each a `StageChunk` sharing its modules with the rank's trimmed GPT (so
the optimizer, checkpoints and the export see one module under the plain GPT's names). Each stage is the plain
GPT with the layers it does not own deleted (GPT.layers is a ModuleDict keyed "0".."L-1", so the
parameter names stay those of the plain model) and tok_emb/pos_emb (non-first) or ln_f/lm_head
(non-last) set to None, which GPT.forward treats as "pass hidden states through".

Ranks: pp x dp = world size. rank r is stage r // dp, data-parallel replica r % dp (pp outermost:
the replicas of one stage are neighbours, so their gradient all-reduce stays inside a node while
the activations travel between nodes). dp = 1 (the default) is pure pipeline: every rank gets
the same batch; stage 0 consumes the inputs, the last stage the targets.
With dp > 1 each stage module handed to torch's PipelineStage is wrapped in DistributedDataParallel
over the stage's dp group (`_data_parallel`); the stage runs every micro-batch but the last under
no_sync and the last backward with DDP's reducer armed, so the bucketed all-reduce overlaps that
backward (torch/distributed/pipelining/stage.py backward_maybe_with_nosync), as plan/comm.py counts
it. The gradients are views of DDP's buckets and are zeroed in place, not freed, before each step:
no second copy of them (an all-reduce after the schedule, as before, ran serial after the backward
and flattened the stage's gradients into an extra full copy that the planner did not count).

One optimizer step = one schedule step over `microbatches` micro-batches of the per-replica batch.
The schedule runs forward and backward itself, so the plan switches the LightningModule to manual
optimization and steps the optimizer and LR scheduler itself. Loss scaling: the loss of a
micro-batch is its mean token cross-entropy and the schedule divides the summed gradients by the
number of micro-batches (scale_grads=True); with equal micro-batches that is the mean over the
whole batch, the same gradient `single` computes (and dp replicas are averaged on top).

Bubble: each rank times its own compute (the stage's forward_one_chunk / backward_one_chunk and
the loss) inside each schedule step; idle = step - compute. Recorded per step in
`plan.rank_metrics()`; `record_fields` (pipeline_record.py) turns every rank's lists into run.json's
`pipeline` entry next to the prediction (p-1)/m (Huang et al. 2019; Narayanan et al. 2021).

Checkpoints: each stage holds different parameters, so `last.ckpt` is a directory written with
torch.distributed.checkpoint (every rank writes its stage; keys are the plain GPT's names, the
optimizer state is flattened by parameter name) plus `meta.pt` (loops, schedulers, step) from
rank 0. See PipelineStrategy.
"""
from __future__ import annotations

from typing import Any

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch import nn

from scalelab.errors import ConfigError
from scalelab.strategies.base import RunSpec, StrategyPlan
from scalelab.strategies.pipeline_record import PipelineRecord, StageTimer
from scalelab.strategies.pipeline_split import SPLITS, layer_counts, make_stage, stage_chunks

SCHEDULES = ("gpipe", "1f1b", "interleaved_1f1b")
_META = "meta.pt"


def lm_loss(logits: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
    """Mean token cross-entropy of one micro-batch (as LitModule.loss computes it)."""
    return F.cross_entropy(logits.float().reshape(-1, logits.shape[-1]), targets.reshape(-1))


def merge_on_rank0(trainer: Any, local: dict) -> dict | None:
    """Each rank's share of the plain model's state_dict (its stage; {} for replicas that repeat
    one) merged on rank 0, on the host; None elsewhere. Collective: every rank calls it.
    Tensor by tensor, point to point to rank 0, each through its device (NCCL sends device
    tensors): not gather_object of the whole dicts, which on NCCL pickles each into a GPU buffer
    padded to the largest and has rank 0 allocate world x that on its GPU (found by review: a
    14 GB stage at 16 ranks would ask rank 0's GPU for 224 GB)."""
    if not dist.is_initialized() or dist.get_world_size() == 1:
        return {k: v.detach().cpu() for k, v in local.items()}
    device = trainer.strategy.root_device
    shapes = {k: (tuple(v.shape), v.dtype) for k, v in local.items()}   # names, in sending order
    every: list | None = [None] * dist.get_world_size() if trainer.global_rank == 0 else None
    dist.gather_object(shapes, every, dst=0)
    if trainer.global_rank != 0:
        for v in local.values():
            dist.send(v.detach().to(device).contiguous(), dst=0)
        return None
    merged = {k: v.detach().cpu() for k, v in local.items()}
    for src, part in enumerate(every[1:], start=1):
        for k, (shape, dtype) in part.items():
            buf = torch.empty(shape, dtype=dtype, device=device)
            dist.recv(buf, src=src)
            merged[k] = buf.cpu()
    return merged


class Pipeline(PipelineRecord, StrategyPlan):
    name = "pipeline"
    meta_init = True  # parallelize() trims the meta model; configure_model fills this stage only
    clips_gradients_itself = True   # _clip_gradients: the norm over every stage (manual optimization)

    def __init__(self, name: str = "pipeline", schedule: str = "1f1b", microbatches: int = 4, dp: int = 1,
                 stages_per_rank: int = 1, split: str = "uniform", **options):
        super().__init__(name, **options)
        schedule = str(schedule).lower()
        if schedule not in SCHEDULES:
            raise ConfigError(f"strategy.schedule={schedule!r} is not known: choose one of {', '.join(SCHEDULES)}")
        if not isinstance(stages_per_rank, int) or isinstance(stages_per_rank, bool) or stages_per_rank < 1:
            raise ConfigError(f"strategy.stages_per_rank={stages_per_rank!r} must be an integer >= 1")
        if (schedule == "interleaved_1f1b") != (stages_per_rank > 1):
            raise ConfigError(f"strategy.stages_per_rank={stages_per_rank} with strategy.schedule={schedule}: "
                              "interleaved_1f1b needs stages_per_rank >= 2, and stages_per_rank >= 2 needs "
                              "schedule=interleaved_1f1b (gpipe and 1f1b run one stage per rank)")
        split = str(split).lower()
        if split not in SPLITS:
            raise ConfigError(f"strategy.split={split!r} is not known: choose one of {', '.join(SPLITS)}")
        self.stages_per_rank, self.split = stages_per_rank, split
        self._counts: list[int] = []   # layers per (virtual) stage, set in parallelize
        self._cfg = None               # the GPT's config (modelled stage costs)
        self._chunks: list = []        # this rank's StageChunks (stages_per_rank > 1)
        if not isinstance(microbatches, int) or isinstance(microbatches, bool) or microbatches < 1:
            raise ConfigError(f"strategy.microbatches={microbatches!r} must be an integer >= 1")
        if not isinstance(dp, int) or isinstance(dp, bool) or dp < 1:
            raise ConfigError(f"strategy.dp={dp!r} must be an integer >= 1 (data-parallel replicas of the pipeline)")
        self.schedule, self.microbatches, self.dp = schedule, microbatches, dp
        # inside a rank
        self._stage_idx = 0
        self._pp = 1
        self._pp_group = self._dp_group = None
        self._schedule = None
        self._timer = None   # pipeline_record.StageTimer, built with the schedule
        self._n_layers = 0

    # -- before any rank starts ------------------------------------------------------------
    def _pp_degree(self, world_size: int) -> int:
        return max(world_size // self.dp, 1)

    def parallel_degrees(self, world_size: int) -> dict[str, int]:
        if world_size % self.dp:  # validate() reports it; keep derive_batch from failing first
            return {"dp": 1, "tp": 1, "pp": world_size}
        return {"dp": self.dp, "tp": 1, "pp": world_size // self.dp}

    def validate(self, run: RunSpec) -> None:
        super().validate(run)
        world = run.world_size
        if world % self.dp:
            raise ConfigError(f"strategy.dp={self.dp} does not divide the world size {world}: "
                              f"pipeline stages = world size / dp must be a whole number")
        pp = world // self.dp
        from scalelab.models.gpt import GPTConfig

        n_layers = run.model_arch.n_layers if isinstance(run.model_arch, GPTConfig) else None
        if n_layers is None:
            raise ConfigError(f"strategy=pipeline splits a GPT by layers; model {type(run.model_arch).__name__} has "
                              "none: use model=gpt_nano or another gpt_* model")
        if pp > n_layers:
            raise ConfigError(f"strategy=pipeline: {pp} pipeline stages (world size {world} / dp {self.dp}) but the "
                              f"model has {n_layers} layers: use at most {n_layers * self.dp} devices, or raise "
                              "strategy.dp or model.arch.n_layers")
        self._check_batch(run.batch, "pipeline replica")
        self._check_schedule(pp, n_layers, "pipeline stages")
        if run.precision == "16-mixed":
            raise ConfigError("trainer.precision=16-mixed needs a loss scaler, which the pipeline schedule's own "
                              "backward bypasses: use bf16-mixed, bf16-true or 32-true with strategy=pipeline")

    def _check_schedule(self, pp: int, n_layers: int, what: str) -> None:
        """The schedule's own constraints (torch.distributed.pipelining.schedules), before spawn:
        plan.spec's rule, which the planner applies to the same job."""
        from scalelab.plan.splits import pipeline_schedule_refusal

        why = pipeline_schedule_refusal(self.schedule, pp, self.microbatches, self.stages_per_rank, n_layers, what)
        if why:
            raise ConfigError(why)

    def _check_batch(self, batch, per: str) -> None:
        """Accumulation is the schedule's own micro-batches, which must divide the batch `per`
        (pipeline replica, data-parallel rank) that one schedule step runs."""
        if batch is None:
            return
        if batch.accumulate_grad_batches != 1:
            raise ConfigError(f"data.micro_batch_size={batch.per_device_batch_size} means gradient accumulation, "
                              f"which strategy={self.name} does with its pipeline micro-batches: leave "
                              "data.micro_batch_size null and set strategy.microbatches")
        n = batch.per_device_batch_size
        if n % self.microbatches:
            raise ConfigError(f"strategy.microbatches={self.microbatches} does not divide the batch per {per} "
                              f"({n} = data.global_batch_size / dp): use a divisor of {n}")

    # -- inside a rank -----------------------------------------------------------------------
    def dp_rank(self, global_rank: int, world_size: int) -> int:
        return global_rank % self.dp

    def loss_ranks(self, world_size: int) -> list[int]:
        pp = self._pp_degree(world_size)
        return [(pp - 1) * self.dp + d for d in range(self.dp)]

    def lightning_strategy(self, run: RunSpec):
        from scalelab.strategies.pipeline_lightning import PipelineStrategy

        return PipelineStrategy(layout={"stages": self._pp_degree(run.world_size), "dp": self.dp,
                                        "schedule": self.schedule, "microbatches": self.microbatches,
                                        "stages_per_rank": self.stages_per_rank, "split": self.split})

    def _trim(self, net: nn.Module) -> nn.Module:
        """This rank's stage(s) of the plain GPT; the split from the model's own config."""
        self._n_layers, self._cfg = len(net.layers), net.cfg
        total = self._pp * self.stages_per_rank
        self._counts = layer_counts(self._n_layers, total, self.split, net.cfg)
        net = make_stage(net, self._stage_idx, self._pp, self._counts, self.stages_per_rank)
        self._chunks = (stage_chunks(net, self._stage_idx, self._pp, self._counts, self.stages_per_rank)
                        if self.stages_per_rank > 1 else [])
        return net

    def parallelize(self, net: nn.Module, device_mesh: Any) -> nn.Module:
        """Keep this rank's stage of the plain GPT (called in configure_model, after the
        process group exists and before the optimizer is built from the remaining parameters)."""
        world = dist.get_world_size() if dist.is_initialized() else 1
        rank = dist.get_rank() if dist.is_initialized() else 0
        self._pp = world // self.dp
        self._stage_idx = rank // self.dp
        if self.dp > 1:
            from torch.distributed.device_mesh import init_device_mesh

            device_type = "cuda" if "nccl" in str(dist.get_backend()) else "cpu"
            mesh = init_device_mesh(device_type, (self._pp, self.dp), mesh_dim_names=("pp", "dp"))
            self._pp_group, self._dp_group = mesh["pp"].get_group(), mesh["dp"].get_group()
            from scalelab.strategies.group_timeout import like_default

            like_default(mesh)   # trainer.collective_timeout_s, not torch's 10 / 30 min (group_timeout.py)
        return self._trim(net)   # on the meta device: LitModule.configure_model allocates this stage only

    @property
    def is_first(self) -> bool:
        return self._stage_idx == 0

    @property
    def is_last(self) -> bool:
        return self._stage_idx == self._pp - 1

    def _build_schedule(self, pl_module) -> None:
        from torch.distributed.pipelining import (PipelineStage, Schedule1F1B, ScheduleGPipe,
                                                  ScheduleInterleaved1F1B)

        device = pl_module.device
        v, total = self.stages_per_rank, self._pp * self.stages_per_rank
        modules = [self._data_parallel(mod, device) for mod in self._chunks or [pl_module.net]]
        stages = [PipelineStage(mod, self._stage_idx + i * self._pp, total, device, group=self._pp_group)
                  for i, mod in enumerate(modules)]
        self._timer = StageTimer(device)
        timed = self._timer.wrap
        # Bubble measurement: the schedules call these per micro-batch between their send/recv waits.
        for stage in stages:
            stage.forward_one_chunk = timed(stage.forward_one_chunk)
            stage.backward_one_chunk = timed(stage.backward_one_chunk)
            stage.backward_weight_one_chunk = timed(stage.backward_weight_one_chunk)
        if v > 1:
            self._schedule = ScheduleInterleaved1F1B(stages, n_microbatches=self.microbatches,
                                                     loss_fn=timed(lm_loss), scale_grads=True)
            return
        cls = {"gpipe": ScheduleGPipe, "1f1b": Schedule1F1B}[self.schedule]
        self._schedule = cls(stages[0], n_microbatches=self.microbatches, loss_fn=timed(lm_loss), scale_grads=True)

    def _data_parallel(self, module: nn.Module, device: torch.device) -> nn.Module:
        """The stage module (a chunk under interleaving) as the schedule runs it: itself at dp 1,
        else DDP over the stage's dp group (module docstring). The parameters and their names stay
        the plain module's (the optimizer and checkpoints see `pl_module.net`).
        - Its gradients exist before the wrap, so that DDP makes them views of its buckets at once
          (gradient_as_bucket_view re-points the gradients that exist at construction; others only
          in the first step's last backward, that step holding both), and training_step zeroes
          them in place: the buckets hold the only copy.
        - require_backward_grad_sync off: a forward never arms DDP's reducer. The stage runs its
          forwards under no_sync and arms the reducer itself for the last backward; only its shape
          inference on the first step runs the module outside no_sync, which armed the reducer for
          the first micro-batch's backward (one all-reduce more in that step)."""
        if self._dp_group is None:
            return module
        from torch.nn.parallel import DistributedDataParallel

        for p in module.parameters():
            if p.requires_grad and p.grad is None:
                p.grad = torch.zeros_like(p)
        ddp = DistributedDataParallel(module, device_ids=[device.index] if device.type == "cuda" else None,
                                      process_group=self._dp_group, gradient_as_bucket_view=True)
        ddp.require_backward_grad_sync = False
        return ddp

    def training_step(self, pl_module, batch: torch.Tensor, batch_idx: int) -> dict:
        if self._schedule is None:
            self._build_schedule(pl_module)
        opt = pl_module.optimizers()
        # DDP stages (dp > 1): their gradients are views of DDP's buckets, zeroed in place
        opt.zero_grad(set_to_none=self._dp_group is None)
        x, y = batch[:, :-1], batch[:, 1:]
        args = (x,) if self.is_first else ()
        kwargs: dict[str, Any] = {}
        losses: list[torch.Tensor] = []
        if self.is_last:
            kwargs = {"target": y, "losses": losses}
        device = pl_module.device
        self._timer.start_step()
        self._schedule.step(*args, return_outputs=False, **kwargs)
        self._timer.end_step()
        self._clip_gradients(pl_module)
        opt.step()
        scheds = pl_module.lr_schedulers()
        for s in scheds if isinstance(scheds, list) else [scheds] if scheds is not None else []:
            s.step()
        if self.is_last:
            loss = torch.stack([l.detach().float() for l in losses]).mean()
        else:
            # no loss on this stage (see loss_ranks); no H2D copy. fp32 as the last stage's: under
            # bf16-true Lightning's default dtype is bf16, and the broadcast's sizes differed (gloo aborted)
            loss = torch.full((), float("nan"), dtype=torch.float32, device=device)
        # rank 0 logs and draws the progress line; it is stage 0, so it gets the last stage's loss. On
        # every rank whatever its logger or progress bar: nodes may differ in those (same_job.NODE_OWN),
        # and a broadcast some ranks skip hangs the others (one scalar a step; with logger=none the
        # line showed no loss)
        shown = loss.clone()
        dist.broadcast(shown, src=self._loss_src())
        pl_module.log_loss(shown)  # LitModule.log_loss: no per-step host read
        return {"loss": loss, "raw_loss": loss}

    def _loss_src(self) -> int:
        """The global rank whose loss rank 0 logs: the first rank of the last stage."""
        return (self._pp - 1) * self.dp

    def _clip_gradients(self, pl_module) -> None:
        """trainer.gradient_clip_val over the whole model: the norm's squares are summed over stages."""
        trainer = pl_module.trainer
        clip = trainer.gradient_clip_val
        if not clip:
            return
        params = [p for p in pl_module.net.parameters() if p.grad is not None]
        grads = [p.grad for p in params]
        algorithm = getattr(trainer.gradient_clip_algorithm, "value", trainer.gradient_clip_algorithm) or "norm"
        if algorithm == "value":
            for g in grads:
                g.clamp_(-clip, clip)
            return
        sq = torch.stack([g.float().pow(2).sum() for g in grads]).sum() if grads else \
            torch.zeros((), dtype=torch.float32, device=pl_module.device)   # fp32 as the others' (bf16-true)
        dist.all_reduce(sq, group=self._pp_group)
        # torch scales by min(1, clip / (norm + 1e-6)) on the device: no .item() (a device drain per step)
        torch.nn.utils.clip_grads_with_norm_(params, float(clip), sq.sqrt())

    def consolidated_state_dict(self, trainer: Any, pl_module: Any) -> dict | None:
        """Every stage's parameters gathered to rank 0, under the plain GPT's names."""
        # on the device: merge_on_rank0 sends them from there (no host copy on the other ranks)
        local = {} if self.dp_rank(trainer.global_rank, trainer.world_size) else pl_module.net.state_dict()
        return merge_on_rank0(trainer, local)

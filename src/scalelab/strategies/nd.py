"""`nd`: 3-D parallelism, pipeline x data (FSDP2) x tensor, on one device mesh.

One `init_device_mesh(device_type, (pp, dp, tp), mesh_dim_names=("pp", "dp", "tp"))` (with
`dp_replicate` > 1: (pp, dp_replicate, dp_shard, tp) and HSDP over the two dp dims). Rank order:
tp fastest, then dp, then pp (Megatron's, torchtitan's): rank = (pp_i * dp + dp_i) * tp + tp_i,
so a TP group is `tp` consecutive ranks (one node: TP communicates every layer), the dp replicas
of a stage follow, and the stages are outermost (activations cross nodes, gradients stay in).

Each rank builds its part from the existing pieces, in torchtitan's order
(torchtitan/distributed/pipeline_parallel.py, models/llama3/infra/parallelize.py):
1. the stage module of its pp coordinate (pipeline.py `make_stage`: the plain GPT with the layers
   and ends it does not own removed; parameter names stay the plain GPT's);
2. tensor parallelism on the tp sub-mesh (tensor_parallel.py `apply_tensor_parallel`);
3. FSDP2 on the dp sub-mesh (fsdp.py `apply_fsdp`; each Block, then the stage root);
4. the pipeline schedule over the pp sub-mesh's process group (pipeline.py `_build_schedule` /
   `training_step`: a PipelineStage of the FSDP/TP stage; torch's stage defers FSDP's gradient
   reduce-scatter to the last micro-batch and divides by the micro-batch count).

Data: the data-parallel rank of the loader is the dp coordinate; TP peers read the same samples;
all stages of one pipeline replica read the same batch (stage 0 uses the inputs, the last stage the
targets). Loss: on the last stage; `loss_ranks` are the last stage's ranks (their mean = the mean
over the dp replicas; TP peers hold the same loss).

Options shared with the pipeline and tp strategies: `split` (uniform | balanced layer counts,
pipeline_split.py), `stages_per_rank` with schedule=interleaved_1f1b (each rank runs virtual stages
pp_i, pp_i + pp, ...; with dp > 1 every virtual stage is its own FSDP root, since the schedule
calls the stages, never the trimmed GPT's forward), and `sequence_parallel` (tp > 1: the LayerNorm
regions sharded along the sequence, tensor_parallel.tensor_parallel_plan; between pipeline stages
each TP rank then sends its sequence shard to the same TP rank of the next stage).

Every degree may be 1: pp=1 is FSDP x TP through a one-stage schedule, tp=1 is pipeline x FSDP.
Checkpoints: the pipeline strategy's DCP folder (every rank writes its shards under the plain
GPT's names; see nd_lightning.py). Export: every stage's DTensors gathered to full tensors and
merged on rank 0.
"""
from __future__ import annotations

from typing import Any

import torch
import torch.distributed as dist
from torch import nn

from scalelab.errors import ConfigError
from scalelab.strategies.base import RunSpec, full_tensors
from scalelab.strategies.pipeline import SCHEDULES, Pipeline, merge_on_rank0

#: as the pipeline: 16-mixed needs a loss scaler that the schedule's own backward bypasses
PRECISIONS = ("32-true", "32", "bf16-mixed", "bf16-true")
MESH_DIMS = ("pp", "dp", "tp")


def rank_coordinates(rank: int, pp: int, dp: int, tp: int) -> tuple[int, int, int]:
    """(pp, dp, tp) coordinates of a global rank on the (pp, dp, tp) mesh: tp fastest, then dp, then pp."""
    if not 0 <= rank < pp * dp * tp:
        raise ValueError(f"rank {rank} is outside a mesh of {pp} x {dp} x {tp} = {pp * dp * tp} ranks")
    return rank // (dp * tp), (rank // tp) % dp, rank % tp


def coordinate_rank(pp_i: int, dp_i: int, tp_i: int, dp: int, tp: int) -> int:
    return (pp_i * dp + dp_i) * tp + tp_i


def mesh_groups(pp: int, dp: int, tp: int) -> dict[str, list[list[int]]]:
    """The ranks of every group along each mesh dimension (what init_device_mesh builds)."""
    world = pp * dp * tp
    coords = [rank_coordinates(r, pp, dp, tp) for r in range(world)]

    def along(dim: int) -> list[list[int]]:
        groups: dict[tuple, list[int]] = {}
        for r, c in enumerate(coords):
            groups.setdefault(tuple(x for i, x in enumerate(c) if i != dim), []).append(r)
        return [groups[k] for k in sorted(groups)]

    return {"pp": along(0), "dp": along(1), "tp": along(2)}


def _positive_int(key: str, v: Any, what: str) -> int:
    if not isinstance(v, int) or isinstance(v, bool) or v < 1:
        raise ConfigError(f"strategy.{key}={v!r} must be an integer >= 1 ({what})")
    return v


class ND(Pipeline):
    """pp x dp x tp on one device mesh (module docstring). Options: tp, pp, dp_replicate (the rest
    of the world is dp_shard), schedule, microbatches, stages_per_rank, split, sequence_parallel,
    reshard_after_forward."""

    name = "nd"

    def __init__(self, name: str = "nd", tp: int = 1, pp: int = 1, dp_replicate: int = 1,
                 schedule: str = "1f1b", microbatches: int = 4, reshard_after_forward: bool = True,
                 stages_per_rank: int = 1, split: str = "uniform", sequence_parallel: bool = False,
                 **options: Any):
        from scalelab.strategies.tensor_parallel import check_sequence_parallel

        super().__init__(name, schedule=schedule, microbatches=microbatches, dp=1,
                         stages_per_rank=stages_per_rank, split=split, **options)
        self.sequence_parallel = check_sequence_parallel(sequence_parallel)
        self.tp = _positive_int("tp", tp, "tensor-parallel degree, inside a node")
        self.pp = _positive_int("pp", pp, "pipeline stages")
        self.dp_replicate = _positive_int("dp_replicate", dp_replicate, "replicated data-parallel groups (HSDP)")
        self.reshard_after_forward = bool(reshard_after_forward)
        self.precision = "32-true"  # set from the run in lightning_strategy (inside the rank)
        self._coords: tuple[int, int, int] = (0, 0, 0)
        self._world = 1

    # -- degrees ---------------------------------------------------------------------------
    def dp_size(self, world_size: int) -> int:
        return max(world_size // (self.tp * self.pp), 1)

    def _pp_degree(self, world_size: int) -> int:
        return self.pp

    def parallel_degrees(self, world_size: int) -> dict[str, int]:
        return {"dp": self.dp_size(world_size), "tp": self.tp, "pp": self.pp}

    # -- before any rank starts ------------------------------------------------------------
    def validate(self, run: RunSpec) -> None:
        from scalelab.models.gpt import GPTConfig
        from scalelab.strategies.tensor_parallel import check_sequence_length, check_tp_degree

        world, tp, pp = run.world_size, self.tp, self.pp
        if world % (tp * pp):
            raise ConfigError(f"strategy=nd: tp x pp = {tp} x {pp} = {tp * pp} does not divide the world size "
                              f"{world}: tp x pp x dp must equal the world size")
        dp = world // (tp * pp)
        if dp % self.dp_replicate:
            raise ConfigError(f"strategy.dp_replicate={self.dp_replicate} does not divide the data-parallel "
                              f"degree {dp} (world size {world} / tp {tp} / pp {pp})")
        arch = run.model_arch
        if not isinstance(arch, GPTConfig):
            raise ConfigError(f"strategy=nd splits and shards the GPT models only; got {type(arch).__name__}: "
                              "choose a gpt model (model=gpt_nano, gpt_small)")
        devs = run.devices_per_node
        if tp > devs or devs % tp:
            raise ConfigError(f"strategy.tp={tp} cannot fit inside a node of {devs} device(s) (TP runs inside a "
                              f"node): use a tp that divides trainer.devices={devs}")
        if tp > 1:
            check_tp_degree("nd", tp, run, option="tp")
            if self.sequence_parallel:
                check_sequence_length("nd", tp, run, option="tp")
        if pp > arch.n_layers:
            raise ConfigError(f"strategy.pp={pp} pipeline stages but the model has {arch.n_layers} layers: use "
                              f"pp <= {arch.n_layers} or raise model.arch.n_layers")
        self._check_batch(run.batch, "data-parallel rank")
        self._check_schedule(pp, arch.n_layers, "pipeline stages (strategy.pp)")
        if run.precision not in PRECISIONS:
            raise ConfigError(f"trainer.precision={run.precision} is not supported by strategy=nd (the pipeline "
                              f"schedule's backward bypasses a loss scaler): choose one of {', '.join(PRECISIONS)}")
        if self.max_world_size is not None and world > self.max_world_size:  # base check
            raise ConfigError(f"strategy={self.name} runs on at most {self.max_world_size} device(s)")

    # -- inside a rank -----------------------------------------------------------------------
    def dp_rank(self, global_rank: int, world_size: int) -> int:
        """The dp coordinate: TP peers (and the stages of one replica) read the same samples."""
        return rank_coordinates(global_rank, self.pp, self.dp_size(world_size), self.tp)[1]

    def loss_ranks(self, world_size: int) -> list[int]:
        dp = self.dp_size(world_size)
        return [coordinate_rank(self.pp - 1, d, t, dp, self.tp) for d in range(dp) for t in range(self.tp)]

    def _loss_src(self) -> int:
        return coordinate_rank(self.pp - 1, 0, 0, self.dp_size(self._world), self.tp)

    def lightning_strategy(self, run: RunSpec):
        from scalelab.strategies.nd_lightning import NDStrategy

        self.precision = run.precision
        return NDStrategy(layout={"stages": self.pp, "tp": self.tp, "dp": self.dp_size(run.world_size),
                                  "dp_replicate": self.dp_replicate, "schedule": self.schedule,
                                  "microbatches": self.microbatches, "stages_per_rank": self.stages_per_rank,
                                  "split": self.split, "sequence_parallel": self.sequence_parallel})

    def build_mesh(self, device_type: str, world: int):
        from torch.distributed.device_mesh import init_device_mesh

        from scalelab.strategies.group_timeout import like_default

        dp = self.dp_size(world)
        if self.dp_replicate > 1:
            mesh = init_device_mesh(device_type, (self.pp, self.dp_replicate, dp // self.dp_replicate, self.tp),
                                    mesh_dim_names=("pp", "dp_replicate", "dp_shard", "tp"))
        else:
            mesh = init_device_mesh(device_type, (self.pp, dp, self.tp), mesh_dim_names=MESH_DIMS)
        like_default(mesh)   # its groups fail after trainer.collective_timeout_s too, not torch's 10 / 30 min
        return mesh

    def parallelize(self, net: nn.Module, device_mesh: Any) -> nn.Module:
        """Stage of this rank's pp coordinate -> TP on the tp sub-mesh -> FSDP2 on the dp sub-mesh
        (called in configure_model, before the optimizer is built over what remains)."""
        from scalelab.strategies.fsdp import apply_fsdp, fsdp_units, mixed_precision_policy
        from scalelab.strategies.tensor_parallel import apply_tensor_parallel

        world = dist.get_world_size() if dist.is_initialized() else 1
        rank = dist.get_rank() if dist.is_initialized() else 0
        self._world, dp = world, self.dp_size(world)
        self._coords = rank_coordinates(rank, self.pp, dp, self.tp)
        self._pp, self._stage_idx = self.pp, self._coords[0]
        device_type = "cuda" if dist.is_initialized() and "nccl" in str(dist.get_backend()) else "cpu"
        mesh = self.build_mesh(device_type, world)
        self.mesh = mesh
        self._pp_group = mesh["pp"].get_group()
        self._dp_group = None  # FSDP2 reduces the gradients over dp (not Pipeline's DDP wrap of the stage)
        got = tuple(mesh.get_coordinate())
        want = (self._coords[0], self._coords[1] // (dp // self.dp_replicate),
                self._coords[1] % (dp // self.dp_replicate), self._coords[2]) if self.dp_replicate > 1 \
            else self._coords
        if got != want:  # the mesh must lay ranks out as rank_coordinates says (data loader, loss ranks)
            raise RuntimeError(f"rank {rank}: device mesh coordinate {got} != expected {want}")
        from scalelab.strategies.materialize import is_meta

        if device_type == "cuda" and not is_meta(net):
            net = net.to(torch.device("cuda", torch.cuda.current_device()))
        net = self._trim(net)   # this rank's stage, or its virtual stages' union + self._chunks
        if self.tp > 1:
            apply_tensor_parallel(net, mesh["tp"], self.sequence_parallel)
        if dp > 1:
            dp_mesh = mesh["dp_replicate", "dp_shard"] if self.dp_replicate > 1 else mesh["dp"]
            if not self._chunks:
                apply_fsdp(net, dp_mesh, self.precision, self.reshard_after_forward)
            else:
                # Interleaved: the schedule runs the chunks, never net.forward, so each chunk is an
                # FSDP root (torchtitan: one fully_shard per model part) over its Blocks' units.
                from torch.distributed.fsdp import fully_shard

                kw = dict(mesh=dp_mesh, reshard_after_forward=self.reshard_after_forward,
                          mp_policy=mixed_precision_policy(self.precision))
                for unit in fsdp_units(net):
                    fully_shard(unit, **kw)
                for chunk in self._chunks:
                    fully_shard(chunk, **kw)
        return net   # on the meta device: LitModule.configure_model allocates this stage's shards only

    def _clip_gradients(self, pl_module) -> None:
        """trainer.gradient_clip_val over the whole model: the norm of this stage's (DTensor)
        gradients, full over its dp x tp mesh, then the squares summed over the stages."""
        trainer = pl_module.trainer
        clip = trainer.gradient_clip_val
        if not clip:
            return
        params = [p for p in pl_module.net.parameters() if p.grad is not None]
        algorithm = getattr(trainer.gradient_clip_algorithm, "value", trainer.gradient_clip_algorithm) or "norm"
        if algorithm == "value":
            for p in params:
                p.grad.clamp_(-clip, clip)
            return
        if params:
            norm = torch.nn.utils.get_total_norm([p.grad for p in params], 2.0)
            norm = norm.full_tensor() if hasattr(norm, "full_tensor") else norm
        else:
            norm = torch.zeros((), device=pl_module.device)
        sq = norm.float().pow(2)
        if self.pp > 1:
            dist.all_reduce(sq, group=self._pp_group)
        torch.nn.utils.clip_grads_with_norm_(params, float(clip), sq.sqrt())

    def consolidated_state_dict(self, trainer: Any, pl_module: Any) -> dict | None:
        """Every stage's full tensors (gathered over its dp x tp mesh), merged on rank 0 under the
        plain GPT's names. Collective: every rank calls it. Only the stage's (dp 0, tp 0) rank keeps
        the full tensors (on the host, one at a time off the device), and sends them to rank 0."""
        return merge_on_rank0(trainer, full_tensors(pl_module.net, keep=self._coords[1:] == (0, 0)))

    # -- run.json ----------------------------------------------------------------------------
    def rank_metrics(self) -> dict:
        return {**super().rank_metrics(), "coords": list(self._coords)}

    def record_fields(self, per_rank: list[dict], warmup_steps: int, profiled_steps: int = 0) -> dict:
        world = len(per_rank)
        dp = self.dp_size(world)
        out = super().record_fields(per_rank, warmup_steps, profiled_steps)
        out["pipeline"]["dp"] = dp
        out["pipeline"]["tp"] = self.tp
        split = out["pipeline"]
        out["nd"] = {
            "mesh": {"pp": self.pp, "dp": dp, "tp": self.tp, "dp_replicate": self.dp_replicate,
                     "dp_shard": dp // self.dp_replicate},
            "mesh_dim_names": list(MESH_DIMS) if self.dp_replicate == 1 else ["pp", "dp_replicate", "dp_shard", "tp"],
            "rank_order": "tp fastest, then dp, then pp: rank = (pp * dp_size + dp) * tp_size + tp",
            "layers_per_stage": split.get("layers_per_stage"),
            "stage_layers": split.get("stage_layers"),
            "sequence_parallel": self.sequence_parallel and self.tp > 1,  # what ran (tp 1: nothing to shard)
            "coordinates": [dict(zip(MESH_DIMS, r.get("coords") or rank_coordinates(i, self.pp, dp, self.tp)))
                            for i, r in enumerate(per_rank)],
            "groups": mesh_groups(self.pp, dp, self.tp),
            "loss_ranks": self.loss_ranks(world),
        }
        return out


__all__ = ["ND", "rank_coordinates", "coordinate_rank", "mesh_groups", "SCHEDULES"]

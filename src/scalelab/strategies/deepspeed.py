"""`zero1`, `zero2`, `zero3`, `zero2_offload`, `zero3_offload`: DeepSpeed ZeRO through Lightning's
DeepSpeedStrategy.

The whole DeepSpeed config is built here, in Python, from the strategy yaml's options (ZeRO
stage, offload devices, bucket sizes, overlap_comm, ...) plus what the job already knows (micro
batch, precision): users never write DeepSpeed JSON. Two things are left to Lightning on purpose:
`gradient_accumulation_steps` (Lightning fills it from Trainer(accumulate_grad_batches) and refuses
it in the config, Lightning #12299 / #19891) and `gradient_clipping` (from trainer.gradient_clip_val).

On CPU (tests, laptops) the strategy is the subclass in deepspeed_cpu.py; every CPU adaptation
lives there. The CUDA path is Lightning's DeepSpeedStrategy plus the two fixes in
ScaleLabDeepSpeedStrategy (deepspeed_lightning.py), with NCCL chosen by Lightning from the device.

`deepspeed` itself is imported only inside a rank (it takes seconds and, on CPU, must see
DS_ACCELERATOR first); validation before launch only checks that it is installed.
"""
from __future__ import annotations

import importlib.util
import re
from typing import Any

import torch

from scalelab.errors import ConfigError
from scalelab.strategies.base import RunSpec, StrategyPlan

STAGES = (1, 2, 3)
OFFLOAD_DEVICES = ("none", "cpu", "nvme")
#: trainer.precision -> DeepSpeed precision section ("32-true": none, DeepSpeed trains in fp32)
PRECISIONS = ("32-true", "32", "bf16-mixed", "16-mixed")


# stage3_fetch_unit: what ZeRO-3 gathers and releases as one (module docstring of deepspeed_config)
FETCH_UNITS = ("block", "module")
BLOCK_CLASS = "scalelab.models.gpt.Block"
# DeepSpeed's own default leaf classes (deepspeed/runtime/zero/leaf_module_config.py): kept, since
# a configured list replaces them
ZERO3_DEFAULT_LEAVES = ("transformers.models.mixtral.modeling_mixtral.MixtralSparseMoeBlock",
                        "transformers.models.qwen2_moe.modeling_qwen2_moe.Qwen2MoeSparseMoeBlock",
                        "transformers.models.qwen3_moe.modeling_qwen3_moe.Qwen3MoeSparseMoeBlock")


def _nbytes(t: Any) -> int:
    return t.numel() * t.element_size() if isinstance(t, torch.Tensor) else 0


def _unique_nbytes(tensors) -> int:
    """Bytes of distinct storages among tensors (views of one flat buffer count once)."""
    seen, total = set(), 0
    for t in tensors:
        if not isinstance(t, torch.Tensor) or t.numel() == 0:
            continue
        key = (t.untyped_storage().data_ptr(), t.storage_offset(), t.numel())
        if key not in seen:
            seen.add(key)
            total += _nbytes(t)
    return total


class ZeRO(StrategyPlan):
    """One DeepSpeed ZeRO configuration (conf/strategy/zero*.yaml). Every option is a key of
    DeepSpeed's `zero_optimization` section with the same name (see
    https://www.deepspeed.ai/docs/config-json/#zero-optimizations-for-fp16-training), except:
    offload_optimizer / offload_params (a device name: none | cpu | nvme), pin_memory (for both
    offloads), nvme_path, and cpu_adam (see ScaleLabDeepSpeedStrategy._init_optimizers)."""

    name = "zero"
    clips_gradients_itself = True   # DeepSpeed's gradient_clipping (Lightning's DeepSpeedPrecision clips nothing)

    def __init__(self, name: str = "zero", stage: int = 2, offload_optimizer: str = "none",
                 offload_params: str = "none", pin_memory: bool = True, nvme_path: str | None = None,
                 cpu_adam: bool = True, overlap_comm: bool = True, contiguous_gradients: bool = True,
                 reduce_scatter: bool = True, allgather_partitions: bool = True,
                 reduce_bucket_size: int = 200_000_000, allgather_bucket_size: int = 200_000_000,
                 round_robin_gradients: bool = False,
                 stage3_prefetch_bucket_size: int | None = None,
                 stage3_param_persistence_threshold: int | None = None,
                 stage3_max_live_parameters: int | None = None, stage3_max_reuse_distance: int | None = None,
                 sub_group_size: int | None = None, bf16_check_grad_overflow: bool = False,
                 stage3_fetch_unit: str | None = None, **options: Any):
        super().__init__(name, **options)
        self.stage = stage
        self.replicates_model = stage in (1, 2)
        self.meta_init = stage == 3  # ZeRO-3: built on the meta device, then under zero.Init (parallelize)
        self.offload_optimizer, self.offload_params = offload_optimizer, offload_params
        self.pin_memory, self.nvme_path, self.cpu_adam = pin_memory, nvme_path, cpu_adam
        self.bf16_check_grad_overflow = bool(bf16_check_grad_overflow)
        self.zero_options = dict(
            overlap_comm=overlap_comm, contiguous_gradients=contiguous_gradients, reduce_scatter=reduce_scatter,
            allgather_partitions=allgather_partitions, reduce_bucket_size=reduce_bucket_size,
            allgather_bucket_size=allgather_bucket_size, round_robin_gradients=round_robin_gradients)
        self.stage3_options = {k: v for k, v in dict(
            stage3_prefetch_bucket_size=stage3_prefetch_bucket_size,
            stage3_param_persistence_threshold=stage3_param_persistence_threshold,
            stage3_max_live_parameters=stage3_max_live_parameters,
            stage3_max_reuse_distance=stage3_max_reuse_distance, sub_group_size=sub_group_size).items()
            if v is not None}
        self.stage3_fetch_unit = stage3_fetch_unit

    def setup_name(self) -> str:
        """The conf/strategy/ name of this stage and offload setup, with the options it differs in
        (zero1's optimizer offload has no config of its own: zero1 with its option)."""
        opt, params = self.offload_optimizer, self.offload_params
        if opt == params == "none":
            return f"zero{self.stage}"
        if self.stage == 1:
            return f"zero1 strategy.offload_optimizer={opt}"
        defaults = {2: ("cpu", "none"), 3: ("cpu", "cpu")}[self.stage]   # conf/strategy/zero{2,3}_offload.yaml
        return " ".join([f"zero{self.stage}_offload",
                         *([f"strategy.offload_optimizer={opt}"] if opt != defaults[0] else []),
                         *([f"strategy.offload_params={params}"] if params != defaults[1] else [])])

    def _check_name(self, n: str) -> None:
        """A zeroN / zeroN_offload run is what its name says: zero2 strategy.stage=3 ran ZeRO-3 and
        zero2 strategy.offload_optimizer=cpu ZeRO-Offload, each named zero2 in every table (found by
        review). Other names (a user's own config) are theirs."""
        named = re.fullmatch(r"zero(\d)(_offload)?", self.name)
        use = self.setup_name()
        if not named or use.split()[0] == self.name:
            return
        what = (f"strategy.stage={self.stage} is not the stage the name says" if int(named[1]) != self.stage else
                f"strategy.offload_optimizer={self.offload_optimizer} strategy.offload_params={self.offload_params} "
                "is not the offload the name says")
        raise ConfigError(f"{n}: {what}; tables, W&B and the planner name a run by its strategy: use strategy={use}")

    # -- before any rank starts ------------------------------------------------------------
    def validate(self, run: RunSpec) -> None:
        super().validate(run)
        n = f"strategy={self.name}"
        if run.world_size < 1:
            raise ConfigError(f"{n}: world size {run.world_size} must be >= 1")
        if self.stage not in STAGES or isinstance(self.stage, bool):
            raise ConfigError(f"{n}: strategy.stage={self.stage!r} is not a ZeRO stage: choose one of 1, 2, 3")
        for key in ("offload_optimizer", "offload_params"):
            if getattr(self, key) not in OFFLOAD_DEVICES:
                raise ConfigError(f"{n}: strategy.{key}={getattr(self, key)!r} is not an offload device: "
                                  f"choose one of {', '.join(OFFLOAD_DEVICES)}")
        if self.offload_params != "none" and self.stage != 3:
            raise ConfigError(f"{n}: strategy.offload_params={self.offload_params} needs ZeRO stage 3 "
                              f"(got stage {self.stage}); use offload_optimizer for stages 1-2")
        if "nvme" in (self.offload_optimizer, self.offload_params) and not self.nvme_path:
            raise ConfigError(f"{n}: offloading to nvme needs strategy.nvme_path (a folder on a local NVMe drive)")
        if self.stage3_options and self.stage != 3:
            raise ConfigError(f"{n}: strategy.{sorted(self.stage3_options)[0]} applies to ZeRO stage 3 only "
                              f"(got stage {self.stage}): use strategy=zero{self.stage} for stage {self.stage}")
        self._check_name(n)
        for key in ("reduce_bucket_size", "allgather_bucket_size"):
            v = self.zero_options[key]
            if not isinstance(v, int) or isinstance(v, bool) or v < 2 or v % 2:
                raise ConfigError(f"{n}: strategy.{key}={v!r} must be an even integer >= 2 (elements)")
        if self.stage3_fetch_unit is not None and self.stage != 3:
            raise ConfigError(f"{n}: strategy.stage3_fetch_unit applies to ZeRO stage 3 only (got stage {self.stage})")
        if self.stage3_fetch_unit not in (None, *FETCH_UNITS):
            raise ConfigError(f"{n}: strategy.stage3_fetch_unit={self.stage3_fetch_unit!r} is not a fetch unit: "
                              f"choose one of {', '.join(FETCH_UNITS)}")
        for key, v in self.stage3_options.items():
            if not isinstance(v, int) or isinstance(v, bool) or v < 0:
                raise ConfigError(f"{n}: strategy.{key}={v!r} must be an integer >= 0")
        if run.precision not in PRECISIONS:
            raise ConfigError(f"{n}: trainer.precision={run.precision} is not supported by DeepSpeed here: "
                              f"choose one of {', '.join(PRECISIONS)}")
        if run.precision == "16-mixed" and run.accelerator == "cpu":
            raise ConfigError(f"{n}: trainer.precision=16-mixed (DeepSpeed fp16) needs a GPU: "
                              "use bf16-mixed or 32-true on CPU")
        if importlib.util.find_spec("deepspeed") is None:
            raise ConfigError(f"{n} needs DeepSpeed: pip install 'scalelab[deepspeed]' (deepspeed==0.19.8, ninja)")

    # -- inside a rank -----------------------------------------------------------------------
    def deepspeed_config(self, run: RunSpec) -> dict:
        """The DeepSpeed config dict for this job (no gradient_accumulation_steps: Lightning's)."""
        zero: dict[str, Any] = {"stage": self.stage, **self.zero_options}
        if self.stage == 3:
            zero.update(self.stage3_options)
            if self.stage3_fetch_unit == "block":
                # DeepSpeed's leaf modules: one fetch/release hook pair per transformer Block (all
                # its parameters gathered at once, FSDP's unit) instead of one per submodule. The
                # per-submodule hooks are host time: on the 86M GPT at world size 1 on an H200,
                # zero3 ran 119 ms/step with the device busy 27 ms (module hooks ~37 ms of it);
                # benchmarks/strategy_host_cost.py measures the difference on CPU. Numerics are
                # unchanged (the same gathered weights); a Block's weights are live together.
                zero["leaf_module"] = {"classes": [*ZERO3_DEFAULT_LEAVES, BLOCK_CLASS]}
        for key, section in (("offload_optimizer", "offload_optimizer"), ("offload_params", "offload_param")):
            device = getattr(self, key)
            if device != "none":
                zero[section] = {"device": device, "pin_memory": self.pin_memory,
                                 **({"nvme_path": self.nvme_path} if device == "nvme" else {})}
        config: dict[str, Any] = {
            "zero_optimization": zero,
            "zero_allow_untested_optimizer": True,  # any torch optimizer (SGD too); DeepSpeed warns otherwise
            "steps_per_print": 2**31 - 1,  # the run record measures; no DeepSpeed step logs
            "wall_clock_breakdown": False,
            # DeepSpeed's throughput timer (on by default, report interval unset: nothing reads it)
            # synchronizes the device at every forward and step (utils/timer.py): two drains per
            # step on CUDA (found by review; the CPU accelerator's synchronize is a no-op)
            "timers": {"throughput": {"enabled": False}},
        }
        if run.batch is not None:  # DeepSpeed checks train_batch = micro x accumulation x dp
            config["train_micro_batch_size_per_gpu"] = run.batch.per_device_batch_size
        if run.precision == "bf16-mixed":
            # DeepSpeed's mixed precision: 16-bit params/grads in the module, fp32 master weights
            # and Adam moments in the ZeRO optimizer (not torch autocast over fp32 weights).
            # check_grad_overflow (DeepSpeed's default: true) checks every gradient for inf/NaN each
            # step and skips the step on one: ~200 extra ops per step on gpt_nano's 25 parameters
            # and a host read of the result (a device drain per step on GPU, measured with
            # tests/host_syncs.py). torch's bf16 (single, ddp, fsdp, tp) never skips a step, so by
            # default the ZeRO runs train and cost what they do: strategy.bf16_check_grad_overflow.
            config["bf16"] = {"enabled": True, "check_grad_overflow": self.bf16_check_grad_overflow}
        # 16-mixed: Lightning adds the fp16 section (dynamic loss scaling) from its defaults.
        return config

    def lightning_strategy(self, run: RunSpec):
        config = self.deepspeed_config(run)
        if run.accelerator == "cpu":
            from scalelab.strategies.deepspeed_cpu import CPUDeepSpeedStrategy, select_cpu_accelerator

            select_cpu_accelerator()  # before the strategy's __init__ imports deepspeed
            return CPUDeepSpeedStrategy(config=config, cpu_adam=self.cpu_adam, process_group_backend="gloo")
        # GPU: Lightning picks NCCL for CUDA devices and hands it to deepspeed.init_distributed
        from scalelab.strategies.deepspeed_lightning import ScaleLabDeepSpeedStrategy

        return ScaleLabDeepSpeedStrategy(config=config, cpu_adam=self.cpu_adam)

    def parallelize(self, net: Any, device_mesh: Any) -> Any:
        """ZeRO-3 without a whole model per rank. The worker built `net` on the meta device;
        Lightning calls configure_model (LitModule -> here) inside deepspeed.zero.Init
        (DeepSpeedStrategy.model_sharded_context), so a GPT built here has each submodule's
        parameters partitioned as soon as that submodule exists (one layer's full weights at a
        time, on the rank's device). Each parameter is then gathered once and filled with
        GPT.fill_initial's value (fp32, cast to the partition's dtype) by rank 0, whose values
        GatheredParameters(modifier_rank=0) broadcasts: the weights `single` starts from."""
        from scalelab.strategies.materialize import is_meta

        if self.stage != 3 or not is_meta(net):
            return net
        import deepspeed
        import torch.distributed as dist

        seed = net.init_seed
        net = type(net)(net.cfg)
        net.init_seed = seed
        plain = [n for n, p in net.named_parameters() if not hasattr(p, "ds_id")]
        if plain:
            raise RuntimeError(f"ZeRO-3 init: {plain[:3]} were not partitioned (no deepspeed.zero.Init around "
                               "configure_model?)")
        rank0 = not dist.is_initialized() or dist.get_rank() == 0
        with torch.no_grad():
            for name, p in net.named_parameters():
                with deepspeed.zero.GatheredParameters([p], modifier_rank=0):
                    if rank0:
                        full = torch.empty(p.ds_shape, dtype=torch.float32, device=p.device)
                        net.fill_initial(name, full)
                        p.data.copy_(full)
        return net

    # -- measurements ------------------------------------------------------------------------
    def state_bytes(self, trainer: Any, pl_module: Any) -> dict[str, int]:
        """What this rank really holds after an optimizer step (host and device memory together:
        with offload the optimizer part lives in host memory).

        DeepSpeed moves the model states out of the places the default looks (pl_module.net
        parameters, torch optimizer state) into its ZeRO optimizer (trainer.optimizers[0]):
        - params: ZeRO-1/2: the full model, flattened (`bit16_groups_flat`: fp32 under 32-true,
          bf16 under bf16-mixed). ZeRO-3: the rank's partition (`fp16_partitioned_groups_flat`,
          Psi / N) plus the data of any parameter still materialized after the step, i.e. the
          persistent ones below stage3_param_persistence_threshold, whole on every rank by design
          (the unshardable remainder; the default 1e5 elements covers every weight of gpt_nano,
          so the sharding test sets it to 0).
        - optimizer: the inner optimizer's state tensors for the rank's partition (Adam exp_avg,
          exp_avg_sq: 8 Psi / N), plus the fp32 master copy of the partition when it is a tensor
          of its own (4 Psi / N). DeepSpeed 0.19.8 clones it at every stage, even in fp32:
          ZeRO-1/2 `single_partition_of_fp32_groups`; ZeRO-3 `fp32_partitioned_groups_flat` (its
          reuse branch compares `tensor.device == "cpu"/"cuda:0"`, a torch.device against a str,
          which is False, so it always copies). So at N ranks in fp32: 12 Psi / N, against DDP's
          8 Psi: half of (moments + master), i.e. 0.75 x DDP at N = 2, not 0.5.
        Communication buffers (the reduce buckets of reduce_bucket_size elements, ZeRO-3's
        gathered working set) are not model state and are not counted, as DDP's are not.
        """
        opt = _zero_optimizer(trainer)
        if self.stage == 3:
            self._fetch = dict(unit=self.stage3_fetch_unit or "module", **fetch_units(pl_module.net))
        engine = getattr(trainer.strategy, "model", None)
        timer = getattr(engine, "tput_timer", None)
        # what the engine ran with (run.json `deepspeed`), read from it: the per-step device drains
        # the config turns off (throughput timer, ZeRO-1/2's unread gradient norm) and clipping
        self._engine = {"throughput_timer": timer is not None and bool(timer.config.enabled),
                        "compute_grad_norm": getattr(opt, "compute_grad_norm", None),
                        "gradient_clipping": float(engine.gradient_clipping()) if hasattr(engine, "gradient_clipping")
                        else None}
        if opt is None:
            return super().state_bytes(trainer, pl_module)
        inner = getattr(opt, "optimizer", opt)
        moments = sum(_nbytes(v) for st in inner.state.values() for v in st.values()
                      if isinstance(v, torch.Tensor) and v.dim() > 0)
        if hasattr(opt, "fp16_partitioned_groups_flat"):  # ZeRO-3
            partition = [t for t in opt.fp16_partitioned_groups_flat if t is not None]
            params = _unique_nbytes(partition) + sum(_nbytes(p.data) for p in pl_module.net.parameters())
            ptrs = {t.untyped_storage().data_ptr() for t in partition}
            master = sum(_nbytes(t) for t in opt.fp32_partitioned_groups_flat
                         if t.numel() and t.untyped_storage().data_ptr() not in ptrs)
        else:  # ZeRO-1/2 (DeepSpeedZeroOptimizer); BF16_Optimizer names as fallback
            params = _unique_nbytes(getattr(opt, "bit16_groups_flat", None)
                                    or [p for p in pl_module.net.parameters()])
            master = _unique_nbytes(getattr(opt, "single_partition_of_fp32_groups", None)
                                    or getattr(opt, "fp32_groups_flat_partition", []))
        return {"params": params, "optimizer": moments + master}

    def rank_metrics(self) -> Any:
        return {"fetch": getattr(self, "_fetch", None), "engine": getattr(self, "_engine", None)}

    def record_fields(self, per_rank: list[Any], warmup_steps: int, profiled_steps: int = 0) -> dict:
        """run.json `deepspeed` (rank 0's engine settings) and, ZeRO-3, `zero3_fetch` (rank 0's
        fetch units as DeepSpeed registered them)."""
        first = (per_rank or [None])[0] or {}
        out = {"deepspeed": first["engine"]} if first.get("engine") else {}
        return {**out, "zero3_fetch": first["fetch"]} if first.get("fetch") else out

    def grad_bytes(self, trainer: Any, pl_module: Any) -> int:
        """Gradient bytes this rank holds after backward, just before the step: the reduced
        gradient partition the ZeRO optimizer keeps (ZeRO-1/2 `averaged_gradients` /
        `grads_in_partition`, or with offload the fp32 `single_partition_of_fp32_groups[i].grad`
        in host memory; ZeRO-3 `grad_partitions_flat_buffer`, plus an offloaded fp32 partition
        .grad if separate), plus any full-size gradient still alive on the module (param.grad,
        param.grad_accum).

        ZeRO-1 in DeepSpeed 0.19.8 registers the same backward hooks as ZeRO-2 whenever
        overlap_comm or contiguous_gradients is on (stage_1_and_2.py): at an accumulation
        boundary (every micro-batch when accumulate_grad_batches = 1) gradients are reduced
        bucket by bucket during backward and only the partition is kept, so it reports Psi / N
        too. Between boundaries (accumulation) ZeRO-1 keeps full gradients; ZeRO-2 keeps only
        the partition. The reduce bucket itself is a communication buffer, not counted."""
        opt = _zero_optimizer(trainer)
        module = [p.grad for p in pl_module.net.parameters()]
        module += [getattr(p, "grad_accum", None) for p in pl_module.net.parameters()]
        if opt is None:
            return _unique_nbytes(module)
        if hasattr(opt, "fp16_partitioned_groups_flat"):  # ZeRO-3
            buf = getattr(opt, "grad_partitions_flat_buffer", None)
            ptr = buf.untyped_storage().data_ptr() if buf is not None else None
            part = _nbytes(buf) + _unique_nbytes(  # + an offloaded fp32 copy, if separate
                t.grad for t in getattr(opt, "fp32_partitioned_groups_flat", [])
                if t.grad is not None and t.grad.untyped_storage().data_ptr() != ptr)
        else:  # ZeRO-1/2
            if getattr(opt, "grads_in_partition", None) is not None:
                part = _nbytes(opt.grads_in_partition)
            else:
                avg = getattr(opt, "averaged_gradients", None) or {}
                part = _unique_nbytes(t for v in avg.values() if v is not None
                                      for t in (v if isinstance(v, (list, tuple)) else [v]))
            # ZeRO-Offload: the partition's fp32 gradient lives in host memory as the master
            # partition's .grad (and accumulated_grads_in_cpu between accumulation boundaries)
            part += _unique_nbytes(t.grad for t in getattr(opt, "single_partition_of_fp32_groups", []))
            part += _unique_nbytes((getattr(opt, "accumulated_grads_in_cpu", None) or {}).values())
        return part + _unique_nbytes(module)

    def consolidated_state_dict(self, trainer: Any, pl_module: Any) -> dict | None:
        """The plain GPT's state_dict (its own keys: no `net.` / `module.` prefix) on rank 0.
        Parameters come from DeepSpeed's fp32 master weights (deepspeed.utils.
        safe_get_full_fp32_param: an all-gather of the partitions for ZeRO-3, of the fp32
        partitions for ZeRO-1/2), so a bf16-mixed run exports its fp32 weights, not the bf16
        working copy. Collective: every rank calls it, in the same parameter order."""
        from deepspeed.utils import safe_get_full_fp32_param

        net = pl_module.net
        params = dict(net.named_parameters())
        state: dict[str, torch.Tensor] = {}
        rank0 = trainer.global_rank == 0   # the only host copy (not one per rank: 8 x the model per node)
        for key, value in net.state_dict(keep_vars=True).items():
            p = params.get(key)
            if p is None:  # a buffer: replicated, never partitioned
                if rank0:
                    state[key] = value.detach().cpu().clone()
                continue
            full = safe_get_full_fp32_param(p)
            if full is None:  # no ZeRO mapping (frozen parameter): gather it if ZeRO-3 partitioned it
                import deepspeed

                with deepspeed.zero.GatheredParameters([p], enabled=hasattr(p, "ds_id")):
                    full = p.detach().clone()
            if rank0:
                state[key] = full.detach().float().cpu().reshape(p.ds_shape if hasattr(p, "ds_shape") else p.shape)
        return state if rank0 else None


def fetch_units(net: Any) -> dict[str, int]:
    """ZeRO-3's fetch units as DeepSpeed registered them (not as configured): the leaf modules
    (one fetch/release hook pair each, all their parameters gathered together) and how many of
    the parameters they cover (DeepSpeed tags each with `ds_z3_leaf_module` when it registers
    its hooks); the rest are fetched per submodule."""
    params = list(net.parameters())
    return {"leaf_modules": sum(1 for m in net.modules() if getattr(m, "_z3_leaf", False)),
            "params_in_leaves": sum(1 for p in params if hasattr(p, "ds_z3_leaf_module")),
            "params": len(params)}


def _zero_optimizer(trainer: Any):
    """The DeepSpeed (ZeRO) optimizer wrapper of this rank, or None."""
    engine = getattr(trainer.strategy, "deepspeed_engine", None)
    opt = getattr(engine, "optimizer", None)
    return opt if opt is not None and hasattr(opt, "optimizer") else None

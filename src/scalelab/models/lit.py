"""LightningModules that hold a plain nn.Module (built from the model config) and a task.

The strategy plan may parallelize the plain module in configure_model (FSDP2, tensor
parallel), where Lightning has already set up the device mesh.
"""
from __future__ import annotations

from typing import Any, Callable

import lightning as L
import torch
import torch.nn.functional as F
from lightning.pytorch.strategies import DeepSpeedStrategy

from scalelab.models.build import build_net
from scalelab.scaling.lr import build_scheduler, same_lr_at_every_step


class LitModule(L.LightningModule):
    def __init__(self, arch: Any, task: str, optimizer: Callable, lr: float, max_steps: int,
                 warmup: float, decay: str, min_lr_ratio: float, plan: Any = None, fused_on_gpu: bool = False):
        super().__init__()
        self.arch, self.task, self.plan = arch, task, plan
        self.make_optimizer, self.lr, self.fused_on_gpu = optimizer, lr, fused_on_gpu
        self.schedule = dict(max_steps=max_steps, warmup=warmup, decay=decay, min_lr_ratio=min_lr_ratio)
        self.net = build_net(arch)
        self._parallelized = False
        self.keep_on_device = False  # set during strategy teardown (strategies.base.without_teardown_copies)

    def cpu(self):
        return self if self.keep_on_device else super().cpu()

    def configure_model(self) -> None:
        if self.plan is not None and not self._parallelized:
            from scalelab.strategies.materialize import materialize

            self.net = self.plan.parallelize(self.net, self.device_mesh)
            # a plan with meta_init has cut the meta-device model: allocate and fill what this rank
            # kept, on its device, with the GPT's own init (Lightning would otherwise fill it with
            # reset_parameters: Kaiming). A model that holds real tensors passes unchanged.
            self.net = materialize(self.net, self.trainer.strategy.root_device)
            self._parallelized = True

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.net(x)

    def loss(self, batch: torch.Tensor) -> torch.Tensor:
        if self.task == "lm":
            logits = self.net(batch[:, :-1])
            return F.cross_entropy(logits.float().reshape(-1, logits.shape[-1]), batch[:, 1:].reshape(-1))
        # classify: a window of bytes scaled to [0, 1] -> the class of the byte that follows
        n = self.arch.in_features
        # in the weights' dtype: fp32 (autocast casts for its matmuls), bf16 where the module itself
        # is (bf16-true; DeepSpeed's 16-bit modes): an fp32 input there was a dtype error in its first matmul
        dtype = next(self.net.parameters()).dtype
        logits = self.net(batch[:, :n].to(dtype) / 255.0)
        return F.cross_entropy(logits.float(), batch[:, n] % self.arch.num_classes)

    def training_step(self, batch: torch.Tensor, batch_idx: int) -> dict:
        if hasattr(self.plan, "training_step"):  # e.g. a pipeline schedule runs fwd + bwd itself
            return self.plan.training_step(self, batch, batch_idx)
        loss = self.loss(batch)
        # Rank 0's own loss, per step, for the progress bar and logger; the run record holds
        # the all-rank mean (gathered once at the end, so no per-step collective is added).
        self.log_loss(loss)
        return {"loss": loss, "raw_loss": loss.detach()}

    def log_loss(self, loss: torch.Tensor) -> None:
        """`train/loss` of this batch: in trainer.callback_metrics at once (a device tensor: the
        progress bar reads it) and to the loggers LAG_STEPS logged steps late (on_train_batch_end;
        log_every_n_steps x LAG_STEPS optimizer steps, with the step it belongs to): the rows
        Lightning's `self.log(..., logger=True)` writes ("train/loss" and "epoch" at its step),
        without its device reads. Lightning converts a
        logged tensor with `.item()` on every logged step, and a `prog_bar=True` one on every batch
        even with no progress bar shown: on CUDA, each a host sync that drains the device queue
        (tests/unit/test_host_syncs.py). And `self.log` itself costs ~1.5 ms of host time per call
        here (it re-applies `.to(device)` to its stored metric, deep-copying its metadata:
        benchmarks/host_overhead.py), so the value goes into callback_metrics directly."""
        loss = loss.detach()
        self._step_loss = loss
        connector = self.trainer._logger_connector
        if isinstance(getattr(connector, "_callback_metrics", None), dict):
            connector._callback_metrics["train/loss"] = loss
        else:  # another Lightning: its public path (callback_metrics only, no logger, no progress bar)
            self.log("train/loss", loss, on_step=True, on_epoch=False, logger=False)

    def on_train_batch_end(self, outputs: Any, batch: Any, batch_idx: int) -> None:
        trainer = self.trainer
        loss, self._step_loss = getattr(self, "_step_loss", None), None
        # when Lightning would log the step (update_train_step_metrics, right after this hook):
        # the batch that ends an optimizer step, every trainer.log_every_n_steps steps
        if loss is None or not trainer.loggers or trainer.fit_loop._should_accumulate() \
                or not trainer._logger_connector.should_update_logs:
            return
        step = trainer.fit_loop.epoch_loop._batches_that_stepped   # Lightning's logging step
        self._log_losses(self._lagged_losses().push((step, trainer.current_epoch), loss))

    def on_train_end(self) -> None:
        self._log_losses(self._lagged_losses().drain())

    def _lagged_losses(self):
        from scalelab.scaling.metrics import LaggedReads

        if getattr(self, "_lagged", None) is None:
            self._lagged = LaggedReads()
        return self._lagged

    def _log_losses(self, due: list) -> None:
        for (step, epoch), values in due:
            self.trainer._logger_connector.log_metrics({"train/loss": values[0], "epoch": epoch}, step=step)

    def optimizer_step(self, epoch: int, batch_idx: int, optimizer: Any, optimizer_closure: Any = None) -> None:
        super().optimizer_step(epoch, batch_idx, optimizer, optimizer_closure)
        # Free the gradients right after the step, as a hand-written loop does. Lightning frees
        # them only after the next training_step, just before its backward: the whole gradient
        # (fp32: 4 bytes per parameter) then sits beside that step's activations at their peak
        # (the 86M GPT on an H200: 7.29 GiB for `single` against 7.02 for the hand-written loop;
        # 4.8 GB of the 1.2B GPT's 35.5 GiB). Lightning's own zero_grad stays (idempotent: the
        # gradients are None by then). DeepSpeed's engine clears them in its own step; DDP's
        # gradients are views of its buckets, which it keeps (plan.model_states.grads_at_peak).
        # (Lightning calls this hook under automatic optimization only)
        if not isinstance(self.trainer.strategy, DeepSpeedStrategy):
            optimizer.zero_grad(set_to_none=True)

    @property
    def frees_grads_after_step(self) -> bool:
        """Whether this run's gradients are freed at the optimizer step (run.json
        memory.grads_freed_after_step; the planner reads torch-strategy records without it with
        Lightning's order): by optimizer_step above, or by DeepSpeed's engine in its own step
        (ZeRO-3 still keeps its gradient partition buffer: the planner's grads_at_peak knows, and
        does not read this flag for DeepSpeed). Not under manual optimization (a pipeline's
        schedule zeroes them before its forward)."""
        return self.automatic_optimization

    def validation_step(self, batch: torch.Tensor, batch_idx: int) -> None:
        self.log("val/loss", self.loss(batch), sync_dist=True)

    def _fused_on_gpu(self) -> dict:
        """{"fused": True} for Adam/AdamW on a CUDA rank when the config leaves the kernel choice
        to torch (fused and foreach unset) and optim.fused_on_gpu is on. torch still defaults
        to foreach; the fused kernel is a few launches instead of a chain of foreach ops (same
        update, to rounding), as torchtitan's default and the hand-written reference loop of
        benchmarks/gpu_check.py. Measured on an H200 (86M GPT, `single`): 36.1 ms/step fused vs
        35.9 foreach, the same within noise; it is the default for the fewer launches.
        Not with trainer.gradient_clip_val under Lightning's mixed precision (bf16-mixed, 16-mixed
        on single, the ddp family, fsdp, tp): its MixedPrecision.clip_gradients refuses a fused
        optimizer (it unscales gradients itself), bf16 included, and failed the first step of every
        such GPU run (found by review; CPU ranks never ask for fused): foreach there. A plan that
        clips itself (pipeline, nd: clip_grads_with_norm_ under manual optimization) never reaches
        Lightning's clip_gradients, so it keeps the fused kernel (config.validate allows its
        explicit fused=true for the same reason)."""
        import torch
        from lightning.pytorch.plugins.precision import MixedPrecision

        kw = getattr(self.make_optimizer, "keywords", {}) or {}
        if not self.fused_on_gpu or self.device.type != "cuda" or kw.get("fused") is not None \
                or kw.get("foreach") is not None:
            return {}
        if self.trainer.gradient_clip_val and isinstance(self.trainer.precision_plugin, MixedPrecision) \
                and not getattr(self.plan, "clips_gradients_itself", False):
            return {}
        if getattr(self.make_optimizer, "func", None) not in (torch.optim.Adam, torch.optim.AdamW):
            return {}
        return {"fused": True}

    @property
    def flops_per_batch(self) -> int | None:
        """Read by Lightning's ThroughputMonitor (per micro-batch, this rank)."""
        return getattr(self, "_flops_per_batch", None)

    def configure_optimizers(self):
        opt = self.make_optimizer(self.parameters(), lr=self.lr, **self._fused_on_gpu())
        self._configured = [{k: g[k] for k in optimizer_settings(g)} for g in opt.param_groups]   # before a load
        sched = build_scheduler(opt, **self.schedule)
        return {"optimizer": opt, "lr_scheduler": {"scheduler": sched, "interval": "step"}}

    # ---- the LR schedule of a run trained longer ------------------------------------------------
    # Lightning restores the scheduler's saved state over the one configure_optimizers built: a
    # run resumed with a larger trainer.max_steps ("train it longer") kept the earlier run's cosine
    # length and warmup, and its LR climbed back up past the old end (100 -> 200 steps, resumed at
    # 60: LR 0.63 of peak at step 150 and 0.98 at 199, where a 200-step run has 0.26 and 0.10).
    # The checkpoint records the schedule it ran; where this run's differs, the schedule from the
    # resumed step on is this run's own, as if it had been planned this long from step 0.

    @property
    def schedule_run(self) -> dict:
        """The LR schedule this run trains with, as its checkpoints record it."""
        from scalelab.scaling.lr import SCHEDULE_VERSION

        return {**self.schedule, "lr": self.lr, "schedule_version": SCHEDULE_VERSION}

    def on_save_checkpoint(self, checkpoint: dict) -> None:
        checkpoint["scalelab_schedule"] = self.schedule_run
        if getattr(self, "run_config", None) is not None:   # the run's config: checkpoint_config
            from scalelab.checkpoint_config import KEY
            checkpoint[KEY] = self.run_config

    def on_load_checkpoint(self, checkpoint: dict) -> None:
        self._loaded = True   # the optimizer's settings come back with its state: on_train_start
        saved = checkpoint.get("scalelab_schedule")
        # the earlier schedule where it is not this run's (followed at the start of training)
        self._schedule_before = saved if saved not in (None, self.schedule_run) else None
        if self._schedule_before is not None:
            # another schedule's state need not even load into this one (no warmup then: a bare
            # cosine's state, which SequentialLR's load_state_dict refused with KeyError); it is
            # replaced at the start of training anyway (on_train_start)
            checkpoint["lr_schedulers"] = []

    def on_train_start(self) -> None:
        if getattr(self, "_loaded", False):
            self._own_optimizer_settings()
        saved, now = getattr(self, "_schedule_before", None), self.schedule_run
        if saved is None:
            return
        step = int(self.trainer.global_step)
        for config in self.trainer.lr_scheduler_configs:
            lr = follow_schedule(config.scheduler, self.schedule, self.lr, step)
        if same_lr_at_every_step(saved, now):   # a constant LR trained longer: the same LR at every step
            return
        changed = "; ".join(f"{k} {saved.get(k)} -> {v}" for k, v in now.items() if saved.get(k) != v)
        if self.trainer.is_global_zero:   # (Lightning's rank_zero_info: an INFO record no handler showed)
            print(f"[scalelab] resumed at step {step} with another LR schedule ({changed}): from here on it is "
                  f"this run's own (LR now {lr:.3g})", flush=True)

    # ---- the optimizer settings of a run resumed from another run's checkpoint --------------------
    # torch's Optimizer.load_state_dict restores the saved param groups whole: checkpoint.resume_from
    # with another weight decay, momentum, betas or eps trained on with the checkpoint's, silently.
    # This run's own, as configured, from the resumed step on (its LR is the schedule's, above).

    def _own_optimizer_settings(self) -> None:
        changed: dict[str, str] = {}
        for opt in self.trainer.optimizers:
            for group, want in zip(opt.param_groups, getattr(self, "_configured", [])):
                for key, value in want.items():
                    if key not in group or _plain(group[key]) == _plain(value) or key in _IMPLEMENTATION:
                        continue
                    if key in _STATE_LAYOUT:
                        changed[key] = f"{key} stays the checkpoint's {_plain(group[key])}"
                    else:
                        changed[key] = f"{key} {_plain(group[key])} -> {_plain(value)}"
                        group[key] = value
        if changed and self.trainer.is_global_zero:
            print(f"[scalelab] resumed with this run's optimizer settings ({'; '.join(changed.values())}): the "
                  "checkpoint's came back with its state", flush=True)


# param-group keys that are no setting of the config's optimizer: the LR is the schedule's
_NOT_SETTINGS = ("params", "param_names", "lr", "initial_lr")
# settings whose change changes the optimizer's state (Adam's amsgrad: max_exp_avg_sq): the checkpoint's stay
_STATE_LAYOUT = ("amsgrad",)
# how the same update is computed: the checkpoint's stay, silently, since torch's load placed the state
# for them (fused or capturable: each `step` on the parameter's device; a CPU checkpoint's steps under
# a fused CUDA kernel would be host pointers read as device ones)
_IMPLEMENTATION = ("fused", "foreach", "capturable", "differentiable")


def _plain(v: Any) -> Any:
    return list(v) if isinstance(v, (tuple, list)) else v


def optimizer_settings(group: dict) -> dict:
    """A param group's settings (weight_decay, momentum, betas, eps, ...): numbers, flags, names."""
    ok = (int, float, bool, str, type(None))
    return {k: _plain(v) for k, v in group.items() if k not in _NOT_SETTINGS and
            (isinstance(v, ok) or isinstance(v, (tuple, list)) and all(isinstance(x, ok) for x in v))}


def follow_schedule(scheduler: Any, schedule: dict, lr: float, step: int) -> float:
    """Put `scheduler` (and its optimizer's LR) where a scheduler built by build_scheduler(**schedule)
    from peak LR `lr` is after `step` steps: one is built on a one-parameter scratch optimizer and
    stepped there (torch's chained schedulers compute each LR from the previous one, so a state is
    reached by stepping), then its state is loaded. Returns the LR now."""
    import warnings

    scratch_opt = torch.optim.SGD([torch.nn.Parameter(torch.zeros(1))], lr=lr)
    scratch = build_scheduler(scratch_opt, **schedule)
    with warnings.catch_warnings():     # "lr_scheduler.step() before optimizer.step()": no training here
        warnings.simplefilter("ignore")
        for _ in range(step):
            scratch.step()
    scheduler.load_state_dict(scratch.state_dict())
    now = scratch_opt.param_groups[0]["lr"]
    for group in scheduler.optimizer.param_groups:
        group["initial_lr"], group["lr"] = lr, now
    return now


class RankRandomness(L.Callback):
    """Each rank its own random stream for training (dropout), from the run's seed and its rank.

    Every rank seeds the same before the model is built (the same initial weights everywhere),
    so without this every rank drew the same dropout masks: tensor-parallel ranks (other heads),
    pipeline stages (other layers) and data-parallel replicas (other samples) alike. Reseeded before
    every micro-batch from (seed, rank, optimizer step, micro-batch of the step): a run resumed at
    step k draws the masks the uninterrupted run drew from step k on (no RNG state to save; one
    seeding at the start of training gave a resumed run other masks than the uninterrupted one's)."""

    def __init__(self, seed: int):
        self.seed = int(seed)
        self._step, self._micro = -1, 0

    def on_train_batch_start(self, trainer, pl_module, batch, batch_idx) -> None:
        rank, step = int(trainer.global_rank), int(trainer.global_step)
        # counted here, not from batch_idx (whose numbering after a resume is the loop's business)
        self._micro = self._micro + 1 if step == self._step else 0
        self._step = step
        seed = (((self.seed * 1_000_003 + rank) * 1_000_033 + step) * 1_009 + self._micro) % 2 ** 63
        # the generators dropout draws from, not torch.manual_seed: that one also queues a seeding
        # (with its traceback) for each backend not yet started (0.3-2 ms a call; ~2 us here)
        torch.default_generator.manual_seed(seed)
        if torch.cuda.is_initialized():
            torch.cuda.default_generators[torch.cuda.current_device()].manual_seed(seed)

"""The Lightning strategy classes behind `ddp` (with comm hooks) and `single` (independent
replicas). Apart from the plans (ddp.py, single.py) because importing Lightning costs ~2 s: the
launcher validates plans before any rank starts and never needs these; ranks import them.
"""
from __future__ import annotations

from lightning.pytorch.strategies import DDPStrategy


class CommHookDDPStrategy(DDPStrategy):
    """Lightning's DDPStrategy, registering the DDP communication hook on every device.

    Fixes: comm hooks (gradient compression, PowerSGD, post-local SGD) silently NOT applied on
    CPU. Lightning's DDPStrategy._register_ddp_hooks registers them only when the root device is
    CUDA (a limitation of torch 1.8 that no longer holds: with gloo the fp16/bf16 compress,
    PowerSGD and post-local-SGD hooks all run). Without this override a CPU run of
    `strategy=ddp_powersgd` would train as plain DDP and report itself as PowerSGD.

    Also continues the hooks' step counters after a resume (on_train_start): PowerSGD's
    compression start and local SGD's start/period count optimizer steps in the hook state,
    which Lightning does not checkpoint."""

    def _register_ddp_hooks(self) -> None:
        from lightning.pytorch.overrides.distributed import _register_ddp_comm_hook
        from torch.nn.parallel import DistributedDataParallel

        assert isinstance(self.model, DistributedDataParallel)
        _register_ddp_comm_hook(model=self.model, ddp_comm_state=self._ddp_comm_state,
                                ddp_comm_hook=self._ddp_comm_hook, ddp_comm_wrapper=self._ddp_comm_wrapper)

    def on_train_start(self) -> None:
        super().on_train_start()
        step = self.lightning_module.trainer.global_step
        if step and self._ddp_comm_state is not None and hasattr(self._ddp_comm_state, "iter"):
            self._ddp_comm_state.iter = step
        if step and self._model_averager is not None:
            self._model_averager.step = step


class IndependentReplicasStrategy(DDPStrategy):
    """DDPStrategy's process group (for metrics) without DDP's gradient all-reduce."""

    def configure_ddp(self) -> None:  # leave the LightningModule unwrapped
        pass

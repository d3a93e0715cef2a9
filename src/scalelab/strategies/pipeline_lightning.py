"""The Lightning strategy class behind `pipeline` (pipeline.py holds the plan). Apart from the
plan because importing Lightning costs ~2 s: the launcher validates plans before any rank starts
and never needs this; ranks import it.
"""
from __future__ import annotations

from pathlib import Path
from typing import Any

import torch
from lightning.pytorch.strategies import DDPStrategy

from scalelab.strategies.pipeline import _META


class PipelineStrategy(DDPStrategy):
    """DDPStrategy's process group and launch, without a DDP wrapper, for a pipeline.

    - configure_ddp: leaves the module unwrapped (each rank holds a different stage; gradients
      of dp replicas are all-reduced by the plan).
    - setup: switches the LightningModule to manual optimization (the schedule runs forward and
      backward). Done here, after Lightning's loop-configuration check, because the plan clips
      gradients itself (across stages) and validates accumulation itself (it must be 1).
    - save_checkpoint / load_checkpoint: Lightning's DDPStrategy saves rank 0's state only,
      which for a pipeline is stage 0 alone. Here every rank writes its stage's parameters and
      optimizer state with torch.distributed.checkpoint under the plain GPT's names (so a
      checkpoint does not depend on the stage split), and rank 0 adds meta.pt with the rest of
      Lightning's checkpoint (loops, LR schedulers, global step). Loaded after setup, when the
      optimizer exists to receive its state.
    """

    def __init__(self, layout: dict | None = None, **kwargs: Any):
        super().__init__(**kwargs)
        self.layout = layout or {}  # stages / dp / schedule, recorded in meta.pt

    def configure_ddp(self) -> None:
        pass

    def setup(self, trainer) -> None:
        trainer.lightning_module.automatic_optimization = False
        super().setup(trainer)

    @property
    def restore_checkpoint_after_setup(self) -> bool:
        return True

    def _dcp_state(self) -> dict:
        from torch.distributed.checkpoint.state_dict import StateDictOptions, get_optimizer_state_dict

        module = self.lightning_module
        opts = StateDictOptions(flatten_optimizer_state_dict=True)
        return {"model": module.state_dict(),
                "optimizer": [get_optimizer_state_dict(module, o, options=opts) for o in self.optimizers]}

    def save_checkpoint(self, checkpoint: dict, filepath, storage_options: Any = None) -> None:
        import torch.distributed.checkpoint as dcp

        path = Path(filepath)
        if self.is_global_zero and path.is_file():  # a file of that name from an earlier run
            path.unlink()
        self.barrier()
        path.mkdir(parents=True, exist_ok=True)
        dcp.save(self._dcp_state(), checkpoint_id=path)
        if self.is_global_zero:
            meta = {k: v for k, v in checkpoint.items() if k not in ("state_dict", "optimizer_states")}
            meta["pipeline"] = self.layout
            torch.save(meta, path / _META)

    def load_checkpoint(self, checkpoint_path, weights_only: bool | None = None) -> dict:
        import torch.distributed.checkpoint as dcp

        path = Path(checkpoint_path)
        if not (path / _META).is_file():
            raise ValueError(f"checkpoint.resume_from={path} is not a pipeline checkpoint (a directory with {_META} "
                             "written by strategy=pipeline)")
        state = self._dcp_state()
        dcp.load(state, checkpoint_id=path)
        checkpoint = torch.load(path / _META, map_location="cpu", weights_only=False)
        checkpoint["state_dict"] = state["model"]
        checkpoint["optimizer_states"] = state["optimizer"]
        return checkpoint

    def load_optimizer_state_dict(self, checkpoint) -> None:
        from torch.distributed.checkpoint.state_dict import StateDictOptions, set_optimizer_state_dict

        opts = StateDictOptions(flatten_optimizer_state_dict=True)
        for optimizer, state in zip(self.optimizers, checkpoint["optimizer_states"]):
            set_optimizer_state_dict(self.lightning_module, optimizer, state, options=opts)

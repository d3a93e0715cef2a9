"""CPU adaptations of Lightning's DeepSpeedStrategy, all here (shared/notes/cpu-strategies.md
section 4). Lightning 2.6 supports DeepSpeed on CUDA only; DeepSpeed itself runs on CPU (its
`cpu` accelerator, gloo). Each adaptation below is named for what it fixes. None is used on GPU:
ZeRO.lightning_strategy picks this class only when run.accelerator == "cpu".
"""
from __future__ import annotations

import argparse
import os
import sys

from lightning.fabric.utilities.seed import reset_seed
from lightning.pytorch.strategies import DDPStrategy

from scalelab.strategies.deepspeed_lightning import ScaleLabDeepSpeedStrategy


def select_cpu_accelerator() -> None:
    """Fixes DeepSpeed picking a CUDA accelerator (or failing to find one) on a CPU machine.
    DeepSpeed chooses its accelerator once, when `deepspeed.accelerator.get_accelerator()` is
    first called (at `import deepspeed`), from DS_ACCELERATOR; it must therefore be set before
    deepspeed is imported in this process. Called only for run.accelerator == "cpu"."""
    os.environ["DS_ACCELERATOR"] = "cpu"
    if "deepspeed" in sys.modules:  # imported earlier in this process: make sure it chose cpu
        from deepspeed.accelerator import get_accelerator

        name = get_accelerator().device_name()
        if name != "cpu":
            raise RuntimeError(f"deepspeed was imported before DS_ACCELERATOR=cpu was set and chose {name!r}")


def skip_shm_comm_build() -> None:
    """Fixes a C++ compile at the first DeepSpeed job on CPU (25-36 s on an idle 2-core machine,
    minutes under load, and a compiler required): DeepSpeed's TorchBackend JIT-builds its
    shared-memory all-reduce op (deepspeed_shm_comm) when it initializes, for
    `inference_all_reduce` only; training's collectives are torch.distributed's (gloo here).
    Call after select_cpu_accelerator, before deepspeed.init_distributed."""
    import importlib

    # by module name: `import deepspeed.comm.torch as m` gives torch itself (deepspeed.comm's `torch`)
    importlib.import_module("deepspeed.comm.torch").build_shm_op = lambda: None


class CPUDeepSpeedStrategy(ScaleLabDeepSpeedStrategy):
    """DeepSpeedStrategy on CPU ranks. Built with process_group_backend="gloo" (ZeRO.lightning_strategy),
    which Lightning passes to deepspeed.init_distributed; DeepSpeed's CPU accelerator would
    otherwise ask for "ccl" when oneCCL bindings are installed."""

    def setup_environment(self) -> None:
        """Fixes `The DeepSpeed strategy is only supported on CUDA GPUs`: Lightning's
        DeepSpeedStrategy.setup_environment refuses any accelerator but CUDAAccelerator; the
        rest of it is DDPStrategy's, which we call directly."""
        DDPStrategy.setup_environment(self)

    def setup_distributed(self) -> None:
        """Fixes the CUDA device-index check: DeepSpeedStrategy.setup_distributed first checks
        that the selected CUDA indices equal the local ranks (`_validate_device_index_selection`),
        which CPU devices (index None) fail. Everything else as Lightning does it: reset the
        seed, set world ranks, init DeepSpeed's distributed backend (gloo here)."""
        from scalelab.console import quiet_banner

        reset_seed()
        self.set_world_ranks()
        skip_shm_comm_build()
        with quiet_banner():   # DeepSpeed's op builders print that they built or loaded an op
            self._init_deepspeed_distributed()

    def _setup_model_and_optimizer(self, model, optimizer, lr_scheduler=None):
        """Fixes `'>=' not supported between instances of 'NoneType' and 'int'` in
        deepspeed.initialize: Lightning passes args.device_rank = root_device.index, which is None
        for torch.device("cpu"). Use the rank's LOCAL_RANK (Lightning's local_rank, from
        TorchElastic or SLURM). Otherwise Lightning's method unchanged."""
        import deepspeed

        model_parameters = filter(lambda p: p.requires_grad, model.parameters())
        engine, ds_optimizer, _, _ = deepspeed.initialize(
            args=argparse.Namespace(device_rank=self.local_rank), config=self.config, model=model,
            model_parameters=model_parameters, optimizer=optimizer, lr_scheduler=lr_scheduler,
            dist_init_required=False)
        return engine, ds_optimizer

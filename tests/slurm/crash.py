"""For the SLURM tests only, selected with `strategy._target_=tests.slurm.crash.<Class>`; the job's
ranks import it through PYTHONPATH (tests/conftest.py env(); sbatch passes the environment on).
- CrashingDDP: `ddp` whose rank 1 raises at step 3 (a rank crash inside a SLURM job).
- SlowDDP: `ddp` with 50 ms more per step, the same numbers: the requeue test's signals must land
  mid-run, and the steps of this small model alone (17 ms) end the run before a requeue lands."""
import time

from scalelab.strategies.ddp import DDP


class CrashingDDP(DDP):
    def lightning_strategy(self, run):
        from lightning.pytorch.strategies import DDPStrategy

        class _Crash(DDPStrategy):
            def training_step(self, *args, **kwargs):
                if self.global_rank == 1 and self.lightning_module.trainer.global_step == 3:
                    raise RuntimeError("injected rank crash at step 3")
                return super().training_step(*args, **kwargs)

        return _Crash(**self.ddp_kwargs)


class SlowDDP(DDP):
    def lightning_strategy(self, run):
        from lightning.pytorch.strategies import DDPStrategy

        class _Slow(DDPStrategy):
            def training_step(self, *args, **kwargs):
                time.sleep(0.05)
                return super().training_step(*args, **kwargs)

        return _Slow(**self.ddp_kwargs)

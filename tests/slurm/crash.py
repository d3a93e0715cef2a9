"""For the SLURM failure test only: `ddp` whose rank 1 raises at step 3 (a rank crash inside a
SLURM job). Selected with `strategy._target_=tests.slurm.crash.CrashingDDP`; the job's ranks
import it through PYTHONPATH (tests/conftest.py env(); sbatch passes the environment on)."""
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

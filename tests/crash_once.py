"""`strategy._target_=tests.crash_once.CrashOnceDDP`: `ddp` whose global rank 2 raises at step 3
the first time only (a marker file, $CRASH_ONCE_MARKER, records that it did): the same command
run again then goes on from the job's checkpoints, as after a real crash. For the multi-node
resume test (tests/integration/test_multinode.py)."""
import os
from pathlib import Path

from scalelab.strategies.ddp import DDP


class CrashOnceDDP(DDP):
    def lightning_strategy(self, run):
        from lightning.pytorch.strategies import DDPStrategy

        class _CrashOnce(DDPStrategy):
            def training_step(self, *args, **kwargs):
                marker = Path(os.environ["CRASH_ONCE_MARKER"])
                if self.global_rank == 2 and self.lightning_module.trainer.global_step == 3 and not marker.exists():
                    marker.write_text("crashed")
                    raise RuntimeError("injected crash at step 3 (once)")
                return super().training_step(*args, **kwargs)

        return _CrashOnce(**self.ddp_kwargs)

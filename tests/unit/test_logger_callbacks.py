"""The callbacks that only feed a logger (LiveThroughput: Lightning's ThroughputMonitor; the LR
monitor) run in every step's measured time: under logger=none they are left out (LiveThroughput's
update was 0.56 ms of each step on every rank, 20 % of a tiny model's step, for nothing logged)."""
import pytest
from lightning.pytorch.callbacks import Callback

from scalelab.results.throughput_live import LiveThroughput
from scalelab.scaling.metrics import HostLRMonitor

from ..host_syncs import run_job, write_job


class Seen(Callback):
    def on_fit_start(self, trainer, pl_module) -> None:
        self.kinds = {type(c) for c in trainer.callbacks}


@pytest.mark.parametrize("logger,fed", [("none", False), ("csv", True)])
def test_logger_only_callbacks_run_with_a_logger(tmp_path, logger, fed):
    seen = Seen()
    job = write_job(tmp_path / "job", ["strategy=single", "model=gpt_nano", f"logger={logger}",
                                       "trainer.accelerator=cpu", "trainer.max_steps=2", "trainer.warmup_steps=1",
                                       "trainer.profile_steps=0", "data.global_batch_size=4"])
    assert run_job(job, extra_callbacks=[seen])["status"] == "completed"
    assert (LiveThroughput in seen.kinds, HostLRMonitor in seen.kinds) == (fed, fed)

"""A periodic checkpoint (checkpoint.every_n_steps) saves after one step's on_train_batch_end and
before the next step starts: its time must be in no step's time (it was in the next step's, so
median, p90 and throughput of a run with checkpoints counted the saves, most for the strategies
whose sharded saves cost most). run.json keeps each save's seconds apart (timing.checkpoint_saves_s)."""
import time

import torch

from scalelab.checkpointing import periodic_checkpoint
from scalelab.scaling.metrics import StepMetrics

SAVE_S = 0.3


class _Plan:
    def state_bytes(self, trainer, pl_module):
        return {}

    def grad_bytes(self, trainer, pl_module):
        return 0


def test_a_slow_save_is_in_no_step_s_time(tmp_path):
    import lightning as L
    from torch.utils.data import DataLoader, TensorDataset

    class Tiny(L.LightningModule):
        def __init__(self):
            super().__init__()
            self.lin = torch.nn.Linear(4, 1)

        def training_step(self, batch, i):
            loss = self.lin(batch[0]).pow(2).mean()
            return {"loss": loss, "raw_loss": loss.detach()}

        def configure_optimizers(self):
            return torch.optim.SGD(self.parameters(), lr=0.01)

    metrics = StepMetrics(accumulate=1, plan=_Plan())
    periodic = periodic_checkpoint(tmp_path, every=2, keep=1, note_progress=False)
    real_save = periodic.save

    def slow_save(trainer, step):
        time.sleep(SAVE_S)
        return real_save(trainer, step)

    periodic.save = slow_save
    periodic.after_save = metrics.checkpoint_saved                                       # as the worker
    trainer = L.Trainer(accelerator="cpu", devices=1, max_steps=6, logger=False, enable_checkpointing=False,
                        enable_progress_bar=False, enable_model_summary=False, default_root_dir=str(tmp_path),
                        callbacks=[metrics, periodic])
    trainer.fit(Tiny(), train_dataloaders=DataLoader(TensorDataset(torch.randn(64, 4)), batch_size=4))
    assert len(metrics.step_times) == 6 and len(periodic.save_s) == 3      # saves after steps 2, 4, 6
    assert max(metrics.step_times[1:]) < 0.2, metrics.step_times             # steps 3 and 5 follow a save
    assert all(s >= SAVE_S for s in periodic.save_s), periodic.save_s
    assert sorted(p.name for p in (tmp_path / "checkpoints").glob("*.ckpt")) == ["step-00000006.ckpt"]

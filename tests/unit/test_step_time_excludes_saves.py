"""A periodic checkpoint (checkpoint.every_n_steps) saves after one step's on_train_batch_end and
before the next step starts: its time must be in no step's time (it was in the next step's, so
median, p90 and throughput of a run with checkpoints counted the saves, most for the strategies
whose sharded saves cost most). run.json keeps each save's seconds apart (timing.checkpoint_saves_s)."""
import time

import torch

from scalelab.checkpointing import periodic_checkpoint
from scalelab.scaling.metrics import StepMetrics

from .test_data_split import _Plan

SAVE_S = 0.3


def tiny_fit(max_steps: int, callbacks: list, root, configure_optimizers=None, on_step=None):
    """A real Lightning fit of a 4 -> 1 linear model (64 samples, batch 4) with these callbacks:
    what StepMetrics times and what the checkpoint callback saves, without the platform's model."""
    import lightning as L
    from torch.utils.data import DataLoader, TensorDataset

    class Tiny(L.LightningModule):
        def __init__(self):
            super().__init__()
            self.lin = torch.nn.Linear(4, 1)

        def training_step(self, batch, i):
            if on_step is not None:
                on_step(self)
            loss = self.lin(batch[0]).pow(2).mean()
            return {"loss": loss, "raw_loss": loss.detach()}

        def configure_optimizers(self):
            return (configure_optimizers or (lambda m: torch.optim.SGD(m.parameters(), lr=0.01)))(self)

    trainer = L.Trainer(accelerator="cpu", devices=1, max_steps=max_steps, logger=False, enable_checkpointing=False,
                        enable_progress_bar=False, enable_model_summary=False, default_root_dir=str(root),
                        callbacks=callbacks)
    trainer.fit(Tiny(), train_dataloaders=DataLoader(TensorDataset(torch.randn(64, 4)), batch_size=4))
    return trainer


def test_a_slow_save_is_in_no_step_s_time(tmp_path):
    metrics = StepMetrics(accumulate=1, plan=_Plan())
    periodic = periodic_checkpoint(tmp_path, every=2, keep=1, note_progress=False)
    real_save = periodic.save

    def slow_save(trainer, step):
        time.sleep(SAVE_S)
        return real_save(trainer, step)

    periodic.save = slow_save
    periodic.after_save = metrics.checkpoint_saved                                       # as the worker
    tiny_fit(6, [metrics, periodic], tmp_path)
    assert len(metrics.step_times) == 6 and len(periodic.save_s) == 3      # saves after steps 2, 4, 6
    assert max(metrics.step_times[1:]) < 0.2, metrics.step_times             # steps 3 and 5 follow a save
    assert all(s >= SAVE_S for s in periodic.save_s), periodic.save_s
    assert sorted(p.name for p in (tmp_path / "checkpoints").glob("*.ckpt")) == ["step-00000006.ckpt"]

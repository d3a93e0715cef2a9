"""run.json lr_final is the LR the last step used. It was the optimizer's LR after fit, which the
scheduler had already moved on to the step after the last (a walkthrough: csv lr-AdamW at the last
step 0.000214, lr_final 0.0002, and the dashboard legend 'lr 0.002->0.0002' repeated it)."""
import torch

from scalelab.scaling.metrics import StepMetrics

from .test_step_time_excludes_saves import _Plan


def test_lr_final_is_the_last_step_s_lr():
    import lightning as L
    from torch.utils.data import DataLoader, TensorDataset

    used = []

    class Tiny(L.LightningModule):
        def __init__(self):
            super().__init__()
            self.lin = torch.nn.Linear(4, 1)

        def training_step(self, batch, i):
            used.append(self.trainer.optimizers[0].param_groups[0]["lr"])
            loss = self.lin(batch[0]).pow(2).mean()
            return {"loss": loss, "raw_loss": loss.detach()}

        def configure_optimizers(self):
            opt = torch.optim.SGD(self.parameters(), lr=1.0)
            # LR of step k (0-based) = 1 / (k + 1): after 5 steps the scheduler holds 1/6
            sched = torch.optim.lr_scheduler.LambdaLR(opt, lambda k: 1 / (k + 1))
            return [opt], [{"scheduler": sched, "interval": "step"}]

    metrics = StepMetrics(accumulate=1, plan=_Plan())
    trainer = L.Trainer(accelerator="cpu", devices=1, max_steps=5, logger=False, enable_checkpointing=False,
                        enable_progress_bar=False, enable_model_summary=False, callbacks=[metrics])
    trainer.fit(Tiny(), train_dataloaders=DataLoader(TensorDataset(torch.randn(64, 4)), batch_size=4))
    assert used == [1.0, 1 / 2, 1 / 3, 1 / 4, 1 / 5]
    assert metrics.last_lr == 1 / 5 and trainer.optimizers[0].param_groups[0]["lr"] == 1 / 6

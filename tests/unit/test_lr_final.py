"""run.json lr_final is the LR the last step used. It was the optimizer's LR after fit, which the
scheduler had already moved on to the step after the last (a walkthrough: csv lr-AdamW at the last
step 0.000214, lr_final 0.0002, and the dashboard legend 'lr 0.002->0.0002' repeated it)."""
import torch

from scalelab.scaling.metrics import StepMetrics

from .test_data_split import _Plan
from .test_step_time_excludes_saves import tiny_fit


def test_lr_final_is_the_last_step_s_lr(tmp_path):
    used = []

    def schedule(module):
        opt = torch.optim.SGD(module.parameters(), lr=1.0)
        # LR of step k (0-based) = 1 / (k + 1): after 5 steps the scheduler holds 1/6
        sched = torch.optim.lr_scheduler.LambdaLR(opt, lambda k: 1 / (k + 1))
        return [opt], [{"scheduler": sched, "interval": "step"}]

    metrics = StepMetrics(accumulate=1, plan=_Plan())
    trainer = tiny_fit(5, [metrics], tmp_path, configure_optimizers=schedule,
                       on_step=lambda m: used.append(m.trainer.optimizers[0].param_groups[0]["lr"]))
    assert used == [1.0, 1 / 2, 1 / 3, 1 / 4, 1 / 5]
    assert metrics.last_lr == 1 / 5 and trainer.optimizers[0].param_groups[0]["lr"] == 1 / 6

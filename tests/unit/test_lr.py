import math

import pytest
import torch

from scalelab.errors import ConfigError
from scalelab.scaling.lr import build_scheduler, scaled_lr


def test_linear_rule_doubles_lr_with_double_batch():
    assert scaled_lr(0.1, 256, 512, "linear") == pytest.approx(0.2)


def test_sqrt_rule_doubles_lr_with_4x_batch():
    assert scaled_lr(0.1, 256, 1024, "sqrt") == pytest.approx(0.2)


def test_none_rule_keeps_lr():
    assert scaled_lr(0.1, 256, 1024, "none") == 0.1


def test_unknown_rule_is_named():
    with pytest.raises(ConfigError, match="lr_scaling.rule='cubic'.*linear"):
        scaled_lr(0.1, 1, 1, "cubic")


def _lrs(max_steps, warmup, decay, min_ratio=0.1):
    p = torch.nn.Parameter(torch.zeros(1))
    opt = torch.optim.SGD([p], lr=1.0)
    sched = build_scheduler(opt, max_steps, warmup, decay, min_ratio)
    out = []
    for _ in range(max_steps):
        out.append(opt.param_groups[0]["lr"])
        opt.step()
        sched.step()
    return out


def test_linear_warmup_then_constant():
    lrs = _lrs(10, 4, "constant")
    # step k < 4 trains at (k + 1) / 5 of the peak (nanoGPT's ramp), step 4 on at the peak
    assert lrs[:5] == pytest.approx([0.2, 0.4, 0.6, 0.8, 1.0])
    assert lrs[4:] == pytest.approx([1.0] * 6)


def test_warmup_as_fraction_then_cosine_to_min():
    lrs = _lrs(20, 0.25, "cosine")  # 5 warm-up steps
    assert lrs[4] < lrs[5] == pytest.approx(1.0)
    assert all(a >= b for a, b in zip(lrs[5:], lrs[6:]))  # decays monotonically
    t = 3  # cosine: eta_min + (1 - eta_min) * (1 + cos(pi t / T)) / 2, T = 20 - 5 - 1 = 14
    assert lrs[5 + t] == pytest.approx(0.1 + 0.9 * (1 + math.cos(math.pi * t / 14)) / 2)
    # the last step trains at min_lr_ratio (T = 15 left it at 0.1 + 0.9 (1 + cos(14 pi / 15)) / 2 = 0.1098)
    assert lrs[-1] == pytest.approx(0.1)


def test_a_fraction_warms_up_at_least_one_step_rounded_half_up():
    # 0.1 of 4 steps rounded to 0 and the first step trained at the full LR; 1 step: half of it
    assert _lrs(4, 0.1, "constant") == pytest.approx([0.5, 1.0, 1.0, 1.0])
    # 0.1 x 25 = 2.5 -> 3 steps (round() made it 2, half to even): 1/4, 2/4, 3/4, then the peak
    assert _lrs(25, 0.1, "constant")[:4] == pytest.approx([0.25, 0.5, 0.75, 1.0])
    # 0.1 x 10 = 1 step, then a cosine over steps 1..9 to 0.2 at the last: T = 8
    lrs = _lrs(10, 0.1, "cosine", min_ratio=0.2)
    assert lrs[:2] == pytest.approx([0.5, 1.0])
    assert lrs[5] == pytest.approx(0.2 + 0.8 * (1 + math.cos(math.pi * 4 / 8)) / 2)  # = 0.6
    assert lrs[-1] == pytest.approx(0.2)


def test_no_warmup_cosine_ends_at_min_on_the_last_step():
    lrs = _lrs(5, 0, "cosine", min_ratio=0.0)  # T = 4: 1, (1 + cos(pi/4))/2, 1/2, (1 - cos(pi/4))/2, 0
    c = math.cos(math.pi / 4)
    assert lrs == pytest.approx([1.0, (1 + c) / 2, 0.5, (1 - c) / 2, 0.0], abs=1e-12)


def test_lr_is_logged_once_per_optimizer_step_under_accumulation(tmp_path):
    """Lightning's LearningRateMonitor logs before every micro-batch: 4 accumulated micro-batches
    wrote 4 identical lr rows per step into metrics.csv and W&B."""
    import lightning as L
    from lightning.pytorch.loggers import Logger
    from torch.utils.data import DataLoader, TensorDataset

    from scalelab.scaling.metrics import HostLRMonitor

    class Rows(Logger):
        name, version = "rows", 0
        rows: list = []

        def log_metrics(self, metrics, step=None):
            if any(k.startswith("lr-") for k in metrics):
                self.rows.append((step, dict(metrics)))

        def log_hyperparams(self, params, *args, **kwargs):
            pass

    class Tiny(L.LightningModule):
        def __init__(self):
            super().__init__()
            self.lin = torch.nn.Linear(4, 1)

        def training_step(self, batch, i):
            return self.lin(batch[0]).pow(2).mean()

        def configure_optimizers(self):
            opt = torch.optim.SGD(self.parameters(), lr=1.0)
            return [opt], [{"scheduler": build_scheduler(opt, 3, 2, "constant", 1.0), "interval": "step"}]

    logger = Rows()
    trainer = L.Trainer(accelerator="cpu", devices=1, max_steps=3, accumulate_grad_batches=4, logger=logger,
                        log_every_n_steps=1, enable_checkpointing=False, enable_progress_bar=False,
                        enable_model_summary=False, default_root_dir=str(tmp_path), callbacks=[HostLRMonitor("step")])
    trainer.fit(Tiny(), train_dataloaders=DataLoader(TensorDataset(torch.randn(64, 4)), batch_size=2))
    # 3 optimizer steps of 4 micro-batches: 3 rows, warm-up 1/3, 2/3, then the peak
    assert [step for step, _ in logger.rows] == [0, 1, 2]
    assert [m["lr-SGD"] for _, m in logger.rows] == pytest.approx([1 / 3, 2 / 3, 1.0])


def test_a_constant_lr_trained_longer_is_the_same_schedule():
    """Resumed with a larger max_steps, a constant LR trains every step at the LR it had: the
    console said "another LR schedule (max_steps 10 -> 20)" on every such rerun. By hand: warm-up
    0.1 of 10 steps is 1 step, of 20 steps 2 (0.1 x 20 + 0.5, rounded down): the steps 1-2 of the
    longer run train at lr/3, 2 lr/3 against lr/2, lr: another schedule; 3 steps given as a count are 3 in both."""
    from scalelab.scaling.lr import same_lr_at_every_step

    def sched(max_steps, warmup=0, decay="constant"):
        return {"max_steps": max_steps, "warmup": warmup, "decay": decay, "min_lr_ratio": 0.1, "lr": 0.1,
                "schedule_version": 2}

    assert same_lr_at_every_step(sched(10), sched(20))
    assert same_lr_at_every_step(sched(10, warmup=3), sched(20, warmup=3))
    assert not same_lr_at_every_step(sched(10, warmup=0.1), sched(20, warmup=0.1))
    assert not same_lr_at_every_step(sched(10, decay="cosine"), sched(20, decay="cosine"))   # where it ends moves
    assert not same_lr_at_every_step(sched(10), {**sched(20), "lr": 0.2})
    assert not same_lr_at_every_step(sched(10), sched(20, decay="cosine"))
    assert same_lr_at_every_step(sched(10, decay="cosine"), sched(10, decay="cosine"))

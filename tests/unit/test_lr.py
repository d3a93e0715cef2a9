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
    assert lrs[:5] == pytest.approx([0.25, 0.4375, 0.625, 0.8125, 1.0])
    assert lrs[4:] == pytest.approx([1.0] * 6)


def test_warmup_as_fraction_then_cosine_to_min():
    lrs = _lrs(20, 0.25, "cosine")  # 5 warm-up steps
    assert lrs[4] < lrs[5] == pytest.approx(1.0)
    assert all(a >= b for a, b in zip(lrs[5:], lrs[6:]))  # decays monotonically
    t = 3  # cosine: eta_min + (1 - eta_min) * (1 + cos(pi t / T)) / 2, T = 15
    assert lrs[5 + t] == pytest.approx(0.1 + 0.9 * (1 + math.cos(math.pi * t / 15)) / 2)

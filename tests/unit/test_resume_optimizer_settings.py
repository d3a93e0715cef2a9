"""After a checkpoint loads, the optimizer trains with this run's settings, not the checkpoint's (torch's
Optimizer.load_state_dict restores the saved param groups whole); amsgrad, which changes the state's
layout, and the implementation flags stay the checkpoint's (tests/integration/test_resume_review.py:
SGD through scalelab-train)."""
from __future__ import annotations

from types import SimpleNamespace

import torch

from scalelab.models.lit import LitModule, optimizer_settings


def _resume(saved_kwargs: dict, run_kwargs: dict, capsys) -> tuple[dict, str]:
    torch.manual_seed(0)
    w = torch.nn.Parameter(torch.randn(4, 3))
    saved = torch.optim.AdamW([w], lr=0.01, **saved_kwargs)
    w.grad = torch.randn(4, 3)
    saved.step()
    run = torch.optim.AdamW([w], lr=0.01, **run_kwargs)
    configured = [{k: g[k] for k in optimizer_settings(g)} for g in run.param_groups]   # configure_optimizers
    run.load_state_dict(saved.state_dict())                                             # Lightning's restore
    module = SimpleNamespace(trainer=SimpleNamespace(optimizers=[run], is_global_zero=True), _configured=configured)
    LitModule._own_optimizer_settings(module)
    run.step()   # it still steps with the loaded state
    return run.param_groups[0], capsys.readouterr().out


def test_the_runs_settings_win_and_one_line_says_which(capsys):
    group, out = _resume(dict(betas=(0.8, 0.9), weight_decay=0.0, eps=1e-6, amsgrad=True, foreach=True),
                         dict(betas=(0.9, 0.95), weight_decay=0.1, eps=1e-8), capsys)
    assert (tuple(group["betas"]), group["weight_decay"], group["eps"]) == ((0.9, 0.95), 0.1, 1e-8)
    assert group["amsgrad"] is True and group["foreach"] is True   # the checkpoint's: its state is laid out for them
    assert out == ("[scalelab] resumed with this run's optimizer settings (betas [0.8, 0.9] -> [0.9, 0.95]; eps 1e-06 -> "
                   "1e-08; weight_decay 0.0 -> 0.1; amsgrad stays the checkpoint's True): the checkpoint's came back "
                   "with its state\n")


def test_the_same_settings_say_nothing(capsys):
    same = dict(betas=(0.9, 0.95), weight_decay=0.1)
    group, out = _resume(same, same, capsys)
    assert out == "" and group["weight_decay"] == 0.1

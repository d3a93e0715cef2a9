"""LR scaling rules and the warmup/decay schedule.

- none:   lr = base_lr
- linear: lr = base_lr * B / B0            (Goyal et al. 2017, "Accurate, Large Minibatch SGD")
- sqrt:   lr = base_lr * sqrt(B / B0)      (Krizhevsky 2014; for Adam the square-root rule of
                                            Malladi et al. 2022, "On the SDEs and Scaling Rules
                                            for Adaptive Gradient Algorithms")
B is the global batch, B0 = lr_scaling.base_batch_size, base_lr = optim.lr.
Schedule: linear warmup over n warmup steps (step k < n trains at lr * (k + 1) / (n + 1), as
nanoGPT's), then constant, or cosine decay that the last step (max_steps - 1) trains at
min_lr_ratio * lr, built from torch.optim.lr_scheduler parts.
"""
from __future__ import annotations

import math

from torch.optim import Optimizer
from torch.optim.lr_scheduler import ConstantLR, CosineAnnealingLR, LinearLR, LRScheduler, SequentialLR

from scalelab.errors import ConfigError

RULES = ("none", "linear", "sqrt")
# The schedule's shape, in each checkpoint's scalelab_schedule: 2 = warm-up step k at (k+1)/(n+1),
# cosine at its minimum on the last step (1, unversioned: k at 1/n + ..., the minimum one step after
# the run); a checkpoint of another shape resumes onto this one (models/lit.py follow_schedule)
SCHEDULE_VERSION = 2
DECAYS = ("constant", "cosine")


def scaled_lr(base_lr: float, base_batch: int, global_batch: int, rule: str) -> float:
    if rule not in RULES:
        raise ConfigError(f"lr_scaling.rule={rule!r} is not known: choose one of {', '.join(RULES)}")
    if base_batch < 1:
        raise ConfigError(f"lr_scaling.base_batch_size={base_batch} must be >= 1")
    ratio = global_batch / base_batch
    return base_lr * {"none": 1.0, "linear": ratio, "sqrt": math.sqrt(ratio)}[rule]


def warmup_steps(warmup: float | int, max_steps: int) -> int:
    """warmup >= 1 is a step count; 0 < warmup < 1 is a fraction of max_steps, rounded half up and
    at least 1 step (a fraction asks for a warm-up: 0.1 of 4 steps rounded to 0 trained the first
    step at the full scaled LR)."""
    if warmup < 0:
        raise ConfigError(f"lr_scaling.warmup_steps={warmup} must be >= 0 (steps, or a fraction < 1)")
    return max(1, int(warmup * max_steps + 0.5)) if 0 < warmup < 1 else int(warmup)


def same_lr_at_every_step(a: dict, b: dict) -> bool:
    """Whether two schedules (build_scheduler's keywords, plus lr) train every step at the same LR:
    a constant LR whose warm-up is as long in both differs in max_steps alone, by where it ends
    (a run trained longer: nothing to say of its schedule)."""
    differ = {k for k in {*a, *b} if a.get(k) != b.get(k)}
    if not differ <= {"max_steps"} or a.get("decay") != "constant":
        return not differ

    def n_warm(d: dict) -> int:
        return min(warmup_steps(d["warmup"], d["max_steps"]), d["max_steps"])

    return n_warm(a) == n_warm(b)


def build_scheduler(optimizer: Optimizer, max_steps: int, warmup: float | int, decay: str,
                    min_lr_ratio: float) -> LRScheduler:
    if decay not in DECAYS:
        raise ConfigError(f"lr_scaling.decay={decay!r} is not known: choose one of {', '.join(DECAYS)}")
    n_warm = min(warmup_steps(warmup, max_steps), max_steps)
    parts, milestones = [], []
    if n_warm > 0:
        # Step k < n_warm trains at lr * (k + 1) / (n_warm + 1), step n_warm at lr: a 1-step
        # warm-up is half the LR (start_factor 1 / n_warm made it the full LR: no warm-up at all).
        parts.append(LinearLR(optimizer, start_factor=1.0 / (n_warm + 1), end_factor=1.0,
                              total_iters=n_warm))
        milestones.append(n_warm)
    # The cosine reaches its minimum at the last step that trains (max_steps - 1), so lr_final is
    # min_lr_ratio * lr as documented (T = max_steps - n_warm put it one step after the run).
    rest = max(max_steps - n_warm - 1, 1)
    if decay == "cosine":
        base = optimizer.param_groups[0]["lr"] if not n_warm else optimizer.param_groups[0]["initial_lr"]
        parts.append(CosineAnnealingLR(optimizer, T_max=rest, eta_min=base * min_lr_ratio))
    else:
        parts.append(ConstantLR(optimizer, factor=1.0, total_iters=0))
    if len(parts) == 1:
        return parts[0]
    return SequentialLR(optimizer, parts, milestones=milestones)

"""The profiled window is excluded from the measured steps, so it is taken only where
MIN_MEASURED_STEPS (5) remain after the warm-up: with warm-up 5 and 3 profiled steps, max_steps
11-12 profiled and left 3-4 measured steps (a short run), while 10 left 5 and no profile."""
from types import SimpleNamespace

from omegaconf import OmegaConf

from scalelab.worker import _profile_window


def _window(max_steps, warmup=5, profile=3, resumed=False):
    cfg = OmegaConf.create({"trainer": {"max_steps": max_steps, "warmup_steps": warmup, "profile_steps": profile}})
    return _profile_window(cfg, SimpleNamespace(batch=SimpleNamespace(accumulate_grad_batches=1)), resumed)


def test_a_profile_leaves_five_measured_steps():
    assert [m for m in range(8, 16) if _window(m) is not None] == [13, 14, 15]   # 13 - 5 - 3 = 5 measured
    assert _window(20, profile=0) is None and _window(20, resumed=True) is None

"""CPU ranks x threads above the node's cores share them: the launcher warns (one line) and MFU is
against the cores' peak. Before, 8 ddp ranks on a 2-core host ran without a word and their MFU was
against 8 cores' peak (a walkthrough: 'MFU % 0.9')."""
import os

import pytest

from scalelab import launch
from scalelab.scaling import mfu as mfu_mod

from .test_run_figures import NANO, _hw, _record


def test_the_warning_names_ranks_threads_and_cores(monkeypatch):
    monkeypatch.setattr(os, "sched_getaffinity", lambda pid: {0, 1})
    assert launch.oversubscribed(2, 1, "cpu") is None
    assert launch.oversubscribed(8, 4, "gpu") is None                     # GPU ranks: the device is the device
    line = launch.oversubscribed(8, 1, "cpu")
    assert line.startswith("[scalelab] warning: 8 ranks x 1 thread(s) on 2 cores: the ranks share cores")
    assert line.endswith("(trainer.devices <= 2 on this host)")
    assert launch.oversubscribed(2, 2, "cpu").endswith("(trainer.devices <= 1 on this host)")


def test_mfu_of_ranks_sharing_cores_is_against_the_cores_peak():
    # 10 samples/s x 50,577,408 FLOPs = 505,774,080 FLOP/s. 2 ranks x 2 threads on 4 cores: peak
    # 1e9 x 2 per rank x 2 = 4e9 -> 0.12644352 (test_mfu_by_hand_on_cpu). 8 ranks x 2 threads on 4
    # cores: the 4 cores' 4e9, not 8 x 2e9 = 16e9 -> 0.12644352 again (was 0.03161088).
    fits = dict(_record(), devices_per_node=2)
    fits["hardware"]["host_cores"] = 4
    assert mfu_mod.compute_mfu(fits, NANO, _hw())["value"] == pytest.approx(0.12644352)
    crowded = dict(_record(world=8), devices_per_node=8)
    crowded["hardware"]["host_cores"] = 4
    out = mfu_mod.compute_mfu(crowded, NANO, _hw())
    assert out["value"] == pytest.approx(0.12644352) and out["peak_flops_per_device"] == pytest.approx(0.5e9)

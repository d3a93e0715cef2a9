"""Planner review (2026-12-03): `plan` called a layout with 0.6 % of device memory free a fit while
`scalelab recommend` prunes anything above 90 % (its --memory-headroom): a 99 % fit is an OOM in
practice (the allocator's slack, fragmentation). It still fits, and says it is tight."""
from dataclasses import replace

from scalelab.plan import ModelSpec
from scalelab.plan.hardware import load_hardware
from scalelab.plan.report import render, render_rows
from scalelab.plan.step_time import plan

MODEL = ModelSpec(124_000_000, 12, 768, 12, 50257, 1024)


def _doc(share: float) -> dict:
    """The plan on an H200 whose memory the job fills to `share`."""
    hw = load_hardware("h200")
    total = plan(MODEL, "single", hw, global_batch=8)["memory"]["total_bytes_per_device"]
    return plan(MODEL, "single", replace(hw, memory_bytes=total / share), global_batch=8)


def test_a_fit_above_90_percent_is_said_to_be_tight():
    tight, roomy = _doc(0.95), _doc(0.85)
    assert tight["memory"]["fits"] and roomy["memory"]["fits"]
    # 1 - 0.95 = 5.0 % free, under the 10 % recommend keeps
    assert "-> fits, tight: 5.0% free, under the 10% scalelab recommend keeps for the allocator's slack" in render(tight)
    assert "-> fits\n" in render(roomy) + "\n" and "tight" not in render(roomy)
    fits_column = [line.split()[10] for line in render_rows([tight, roomy]).splitlines()[3:5]]
    assert fits_column == ["tight", "yes"]

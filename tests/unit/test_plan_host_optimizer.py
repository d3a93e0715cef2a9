"""An offloaded optimizer step runs on the host, whose memory bandwidth the node's ranks share: 8
ranks each stepping 1/8 of the model take as long as 1 rank stepping all of it. Predicted per rank
at the whole host bandwidth, 8 ranks of a 7B zero3_offload were 8x faster at it and the plan said
284.5 % scaling efficiency against 1 device."""
import pytest

from scalelab.plan.hardware import load_hardware
from scalelab.plan.spec import ModelSpec
from scalelab.plan.step_time import build_terms, step_time


def test_host_optimizer_time_is_the_node_s_whatever_the_ranks():
    hw = load_hardware("h100_sxm")
    model = ModelSpec.trainer_gpt(8, 1024, 8, 50257, 1024)
    kw = dict(micro_batch=1, precision="bf16-mixed", optimizer="adam", device="gpu")
    one = build_terms(model, "zero3_offload", devices=1, **kw)
    eight = build_terms(model, "zero3_offload", devices=8, **kw)
    t1, t8 = step_time(one, hw)["optimizer_s"], step_time(eight, hw)["optimizer_s"]
    # by hand: 8 ranks x (N / 8 params each) = N params of host traffic, at the one host's bandwidth
    assert eight.opt_host_bytes == pytest.approx(one.opt_host_bytes / 8)
    assert t8 == pytest.approx(t1) and t1 == pytest.approx(one.opt_host_bytes / float(hw.host["memory_bandwidth_bytes_per_s"]))

"""Host memory per node on GPU profiles (plan.peak_memory.host_node_bytes / fits_host): ZeRO-Offload
keeps model states in the node's RAM, shared by its ranks, so a layout can fit the GPUs and not
the host. Expected bytes by hand.

A 40B-parameter model (psi = 4e10) under zero3_offload (optimizer and parameters offloaded) on
8 GPUs of one node, bf16-mixed, Adam: each rank keeps in host memory its 1/8 of
  fp32 master + Adam m, v (12 bytes/param)  + fp32 gradient partition (4)
  + ZeRO-3's host gradient buffer, in the model's dtype (bf16: 2)
  + bf16 parameters (2)                                                   = 20 bytes/param
  20 x 4e10 / 8 = 1e11 bytes, plus the rank's own process (runtime_bytes_per_rank 1.5e9):
  node = 8 x 1.015e11 = 8.12e11 bytes.
"""
from dataclasses import replace

import pytest

from scalelab.plan import ModelSpec
from scalelab.plan.hardware import load_hardware
from scalelab.plan.report import render, render_alternatives
from scalelab.plan.peak_memory import fits_host, host_node_bytes
from scalelab.plan.step_time import build_terms, plan
from scalelab.recommend.space import Request, enumerate_candidates

PSI = 40_000_000_000
MODEL = ModelSpec(PSI, 48, 8192, 64, 32000, 2048)
NODE = 8 * (20 * PSI / 8 + 1.5e9)


def h200(host_bytes: float):
    hw = load_hardware("h200")
    return replace(hw, host={**hw.host, "memory_bytes": host_bytes, "runtime_bytes_per_rank": 1.5e9})


def test_offloaded_states_per_node_by_hand():
    terms = build_terms(MODEL, "zero3_offload", devices=8, micro_batch=1, precision="bf16-mixed",
                        activation_checkpointing="full")
    assert host_node_bytes(terms, h200(1e12)) == pytest.approx(NODE)
    assert fits_host(terms, h200(1e12)) and not fits_host(terms, h200(7.5e11))
    # the same model on two nodes: each holds half as much of it
    two = build_terms(MODEL, "zero3_offload", devices=8, nodes=2, micro_batch=1, precision="bf16-mixed",
                      activation_checkpointing="full")
    assert host_node_bytes(two, h200(1e12)) == pytest.approx(8 * (20 * PSI / 16 + 1.5e9))


def test_plan_says_which_memory_does_not_fit():
    doc = plan(MODEL, "zero3_offload", h200(7.5e11), devices=8, precision="bf16-mixed", activation_checkpointing="full")
    m = doc["memory"]
    assert m["total_bytes_per_device"] <= m["device_memory_bytes"]          # the GPUs hold it
    assert m["host_bytes_per_node"] == pytest.approx(NODE) and m["host_memory_bytes"] == 7.5e11
    assert not m["fits_host"] and not m["fits"]
    text = render(doc)
    assert "-> fits" in text and "host memory per node" in text and "DOES NOT FIT" in text
    assert "of host memory per node" in render_alternatives(doc, [])
    assert plan(MODEL, "zero3_offload", h200(1e12), devices=8, precision="bf16-mixed",
                activation_checkpointing="full")["memory"]["fits"]


def test_no_host_check_without_host_memory_or_on_cpu():
    terms = build_terms(MODEL, "zero3_offload", devices=8, micro_batch=1, precision="bf16-mixed",
                        activation_checkpointing="full")
    hw = h200(0)
    assert fits_host(terms, replace(hw, host={k: v for k, v in hw.host.items() if k != "memory_bytes"}))
    assert host_node_bytes(terms, replace(hw, kind="cpu")) is None


def test_recommend_prunes_what_the_host_cannot_hold():
    req = Request(MODEL, None, h200(7.5e11), "h200", 8, 1, (8,), ("bf16-mixed",), "adam",
                  ("zero3", "zero3_offload"), ("full",))
    cands, pruned = enumerate_candidates(req)
    assert pruned.get("offloaded states do not fit the node's host memory", 0) >= 1
    assert {c.strategy for c in cands} <= {"zero3"}
    more = enumerate_candidates(Request(**{**req.__dict__, "hardware": h200(1e12)}))[0]
    assert any(c.strategy == "zero3_offload" for c in more)


def test_zero2_offload_counts_its_pinned_staging_buffer():
    """zero2_offload: fp32 master + m, v (12) + fp32 gradient partition (4) = 16 bytes/param / 8
    = 8e10 per rank, plus a pinned copy of the largest tensor's gradient (the MLP matrix,
    8192 x 32768 elements, bf16: 536,870,912 bytes), plus the process."""
    terms = build_terms(MODEL, "zero2_offload", devices=8, micro_batch=1, precision="bf16-mixed",
                        activation_checkpointing="full")
    assert terms.states.offloaded_bytes == pytest.approx(16 * PSI / 8)
    assert host_node_bytes(terms, h200(1e12)) == pytest.approx(8 * (16 * PSI / 8 + 8192 * 32768 * 2 + 1.5e9))

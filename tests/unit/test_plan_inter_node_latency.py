"""A ring collective over several nodes pays the network's latency only where it crosses between
nodes (NCCL visits a node's ranks in a row: 2 (N-1) network steps per all-reduce over N nodes,
src/graph/tuning.cc nInterSteps), the node's own latency on its other steps. Every one of a
512-rank ring's 1022 steps at the network's 5 us made 1.3B DDP on 64 nodes latency-bound (MFU 5 %).
Expected values by hand."""
from __future__ import annotations

import pytest

from scalelab.plan import ModelSpec, get_strategy, resolve_layout
from scalelab.plan.comm import Collective, collectives


def test_a_ring_over_two_nodes_crosses_twice_per_all_reduce():
    c = Collective("g", "all_reduce", "dp", 16, 1e9, 3, True, crosses_nodes=True, nodes=2)
    assert c.hops == 30 and c.inter_hops == 2
    # 3 calls: 6 network steps at 5 us, 84 node steps at 1 us, 3 x 1e9 x 2 x 15/16 bytes at 40 GB/s
    assert c.time_s(40e9, 5e-6, 1e-6) == pytest.approx(6 * 5e-6 + 84 * 1e-6 + 3 * 1e9 * 2 * 15 / 16 / 40e9)
    rs = Collective("g", "reduce_scatter", "dp", 512, 1e6, 1, True, crosses_nodes=True, nodes=64)
    assert rs.hops == 511 and rs.inter_hops == 63
    inside = Collective("g", "all_reduce", "dp", 8, 1e6, 1, True)
    assert inside.inter_hops == 0 and inside.time_s(1e9, 1e-6) == pytest.approx(14e-6 + 1e6 * 2 * 7 / 8 / 1e9)


@pytest.mark.parametrize("strategy,devices,nodes,tp,group,expected", [
    ("ddp", 8, 64, None, "dp", 64),     # 512 data-parallel ranks, 8 per node
    ("ddp", 8, 1, None, "dp", 1),
    ("nd", 8, 4, 8, "dp", 4),           # tp 8 fills a node: dp ranks one per node
    ("nd", 8, 4, 8, "tp", 1),
])
def test_the_nodes_a_group_is_on(strategy, devices, nodes, tp, group, expected):
    model = ModelSpec.from_shape(24, 2048, 16, 50304, 2048)
    layout = resolve_layout(get_strategy(strategy), model, devices, nodes, tp=tp)
    assert layout.group_nodes(group) == expected


def test_planned_ddp_collectives_know_their_nodes():
    model = ModelSpec.from_shape(24, 2048, 16, 50304, 2048)
    layout = resolve_layout(get_strategy("ddp"), model, 8, 64, micro_batch=4, global_batch=2048)
    [c] = [c for c in collectives(model, get_strategy("ddp"), layout, "bf16-mixed") if c.op == "all_reduce"]
    assert c.crosses_nodes and c.nodes == 64 and c.inter_hops == 126 and c.hops == 1022

"""Where the planner's groups' ranks land (mesh (pp, [dp_replicate,] dp_shard, tp), tp fastest, rank
r on node r // devices per node) and how many pipeline sends each rank makes. Found by review: a
group's span alone called the dp group [6, 8, 10] of 3 nodes x 8 (tp 2, pp 4) intra-node, and the
pipeline send was 2 m a step whatever the virtual stages (torch's stage sends, counted at pp 2 and
m 4 over 3 steps: 12 per rank at v 1, 36 at v 2). Expected values by hand."""
from __future__ import annotations

import pytest

from scalelab.plan import ModelSpec, get_strategy, resolve_layout
from scalelab.plan import mesh
from scalelab.plan.comm import collectives
from scalelab.plan.hardware import load_hardware
from scalelab.plan.step_time import build_terms, step_time
from scalelab.plan.strategies import as_applied

BIG = ModelSpec.trainer_gpt(8, 1024, 16, 50304, 2048)


def _by_name(colls):
    return {c.name: c for c in colls}


def test_dp_groups_of_3_nodes_tp2_pp4_cross_where_their_ranks_land():
    L = resolve_layout(get_strategy("nd"), BIG, 8, 3, tp=2, pp=4, micro_batch=4, global_batch=48)
    assert (L.dp, L.world) == (3, 24)
    # rank = (pp_i * 3 + dp_i) * 2 + tp_i
    assert L.group_ranks("dp") == ((0, 2, 4), (1, 3, 5), (6, 8, 10), (7, 9, 11),
                                   (12, 14, 16), (13, 15, 17), (18, 20, 22), (19, 21, 23))
    assert L.group_ranks("tp") == tuple((2 * i, 2 * i + 1) for i in range(12))
    assert L.group_ranks("pp") == tuple((j, j + 6, j + 12, j + 18) for j in range(6))
    # nodes 0,0,0 | 0,1,1 | 1,1,2 | 2,2,2: 4 of the 8 dp groups on 2 nodes
    assert [mesh.nodes_of(g, 8) for g in L.group_ranks("dp")] == [1, 1, 2, 2, 2, 2, 1, 1]
    assert L.group_spans_nodes("dp") and L.group_nodes("dp") == 2
    assert not L.group_spans_nodes("tp") and L.group_nodes("tp") == 1


def test_the_demo_charges_fsdp_and_the_pipeline_as_inter_node():
    terms = build_terms(BIG, "nd", devices=8, nodes=3, tp=2, pp=4, micro_batch=4, global_batch=48)
    c = _by_name(terms.colls)
    for name in ("param_all_gather_fwd", "param_all_gather_root", "grad_reduce_scatter"):
        assert c[name].crosses_nodes and c[name].nodes == 2 and c[name].inter_hops == 1, name
    # pp rank 2 at dp 0, tp 0 (rank 12, node 1) sends forward to rank 18 (node 2) and back to
    # rank 6 (node 0): both of its 2 sends a micro-batch cross, x 4 micro-batches
    send = c["pp_activation_send"]
    assert send.crosses_nodes and send.calls == 8 and "pp_activation_send_in_node" not in c


def test_hsdp_shard_groups_cross_nodes_though_their_span_fits_one():
    st = get_strategy("nd", {"pp": 2, "tp": 2, "dp_replicate": 2})
    m = ModelSpec.from_shape(4, 64, 4, 256, 64)
    L = resolve_layout(st, m, 8, 3, tp=2, pp=2)
    assert (L.dp, L.dp_shard, L.dp_replicate) == (6, 3, 2)
    # rank = pp_i * 12 + replica * 6 + shard * 2 + tp_i; the span tp x dp_shard = 6 fits in 8
    assert L.group_ranks("dp_shard") == ((0, 2, 4), (1, 3, 5), (6, 8, 10), (7, 9, 11),
                                         (12, 14, 16), (13, 15, 17), (18, 20, 22), (19, 21, 23))
    assert L.group_ranks("dp_replicate") == ((0, 6), (1, 7), (2, 8), (3, 9), (4, 10), (5, 11),
                                             (12, 18), (13, 19), (14, 20), (15, 21), (16, 22), (17, 23))
    assert L.group_nodes("dp_shard") == 2 and L.group_nodes("dp_replicate") == 2
    c = _by_name(collectives(m, as_applied(st, L.dp), L, "bf16-mixed"))
    assert c["grad_reduce_scatter"].crosses_nodes and c["grad_reduce_scatter"].nodes == 2
    assert c["grad_all_reduce_replicas"].crosses_nodes and c["grad_all_reduce_replicas"].nodes == 2


def test_groups_inside_a_node_stay_intra_node():
    L = resolve_layout(get_strategy("nd"), BIG, 8, 2, tp=2, pp=2, micro_batch=1, global_batch=32)
    # dp 4: stage 0 is ranks 0-7 (node 0), stage 1 ranks 8-15 (node 1)
    assert L.group_ranks("dp")[0] == (0, 2, 4, 6) and not L.group_spans_nodes("dp")
    c = _by_name(collectives(BIG, as_applied(get_strategy("nd"), L.dp), L, "bf16-mixed"))
    assert not c["grad_reduce_scatter"].crosses_nodes and c["pp_activation_send"].crosses_nodes


@pytest.mark.parametrize("pp,dp,tp", [(4, 3, 2), (2, 2, 2), (3, 1, 4), (1, 8, 1), (2, 3, 1)])
def test_the_planners_groups_are_the_meshes(pp, dp, tp):
    from scalelab.strategies.nd import mesh_groups

    real = mesh_groups(pp, dp, tp)
    for group in ("pp", "dp", "tp"):
        assert [list(g) for g in mesh.group_ranks(group, pp, dp, tp)] == real[group], group


@pytest.mark.parametrize("pp,v,expected", [
    (2, 1, [1, 1]),            # rank 0 only forward, rank 1 only backward
    (2, 2, [3, 3]),            # stages 0,2 | 1,3: 2 forward + 1 backward | 1 + 2
    (4, 1, [1, 2, 2, 1]),
    (4, 2, [3, 4, 4, 3]),      # stages 0,4 | 1,5 | 2,6 | 3,7 of 8
    (3, 3, [5, 6, 5]),         # stages 0,3,6 | 1,4,7 | 2,5,8 of 9
])
def test_sends_per_rank_follow_the_virtual_stages(pp, v, expected):
    assert mesh.sends_per_micro_batch(pp, v) == expected


@pytest.mark.parametrize("v,calls", [(1, 4), (2, 12)])   # the reviewer's 12 and 36 per 3 steps
def test_an_interleaved_rank_sends_at_each_virtual_boundary(v, calls):
    extra = {"schedule": "interleaved_1f1b", "stages_per_rank": 2} if v > 1 else {}
    st = get_strategy("nd", {"pp": 2, **extra})
    m = ModelSpec.trainer_gpt(4, 64, 4, 256, 64)
    L = resolve_layout(st, m, 4, pp=2, micro_batch=1, global_batch=8)
    assert (L.micro_batches, L.stages_per_rank) == (4, v)
    send = _by_name(collectives(m, as_applied(st, L.dp), L, "bf16-mixed"))["pp_activation_send"]
    assert send.calls == calls and send.bytes_per_call == 1 * 64 * 64 * 2


def test_step_time_charges_the_interleaved_sends():
    m = ModelSpec.trainer_gpt(4, 64, 4, 256, 64)
    hw = load_hardware("h100_sxm")
    comm = {}
    for v in (1, 2):
        extra = {"schedule": "interleaved_1f1b", "stages_per_rank": 2} if v > 1 else {}
        terms = build_terms(m, get_strategy("nd", {"pp": 2, **extra}), devices=2, micro_batch=1, global_batch=4)
        assert [c.name for c in terms.colls] == ["pp_activation_send"]   # dp 1: no FSDP
        comm[v] = step_time(terms, hw)["comm_total_s"]
    link = hw.link(False, "p2p")
    one = link.latency_s + 1 * 64 * 64 * 4 / link.bandwidth_bytes_per_s   # fp32 residual, no FSDP
    # 4 micro-batches: 4 sends at v 1, 12 at v 2
    assert comm[2] - comm[1] == pytest.approx(8 * one * hw.slowdown(2))


def test_only_the_sends_to_another_node_are_inter_node():
    # pp 4 on 2 nodes x 8, dp 4: stages 0,1 on node 0, stages 2,3 on node 1; a middle rank sends
    # one of its 2 sends a micro-batch across (stage 1 -> 2 forward, 2 -> 1 backward)
    m = ModelSpec.from_shape(8, 256, 8, 256, 128)
    L = resolve_layout(get_strategy("pipeline"), m, 8, 2, pp=4, micro_batches=4)
    c = _by_name(collectives(m, get_strategy("pipeline"), L, "32"))
    assert c["pp_activation_send"].crosses_nodes and c["pp_activation_send"].calls == 4
    assert not c["pp_activation_send_in_node"].crosses_nodes and c["pp_activation_send_in_node"].calls == 4
    # interleaved, v 2: rank 1's stages 1 and 5 send forward to rank 2 (node 1) twice and back to
    # rank 0 twice: 2 across + 2 inside; rank 3 -> rank 0 (stage 3 -> 4) crosses too, 1 of its 3
    st = get_strategy("nd", {"pp": 4, "schedule": "interleaved_1f1b", "stages_per_rank": 2})
    L = resolve_layout(st, m, 8, 2, pp=4, micro_batch=1, global_batch=16)
    assert (L.dp, L.micro_batches) == (4, 4)
    assert mesh.worst_rank_sends(4, 4, 1, 2, 8) == (2, 4)
    c = _by_name(collectives(m, as_applied(st, L.dp), L, "32"))
    assert c["pp_activation_send"].calls == 8 and c["pp_activation_send_in_node"].calls == 8


def test_the_tied_embedding_all_reduce_is_between_two_ranks():
    # pipeline pp 4 on 3 nodes x 8 (dp 6): first stage rank d (node 0), last 18 + d (node 2): the
    # pair is on 2 nodes, not the pp group's 3
    m = ModelSpec.from_shape(8, 256, 8, 256, 128)
    L = resolve_layout(get_strategy("pipeline"), m, 8, 3, pp=4, micro_batches=4)
    tied = _by_name(collectives(m, get_strategy("pipeline"), L, "32"))["pp_tied_embedding_all_reduce"]
    assert tied.crosses_nodes and tied.nodes == 2 and tied.hops == 2 and tied.inter_hops == 2

"""Where the ranks of the planner's groups sit, and so which collectives cross between nodes.

scalelab lays ranks out on one device mesh (pp, [dp_replicate,] dp_shard, tp), tp fastest
(strategies/nd.py rank_coordinates: rank = (pp_i * dp + dp_i) * tp + tp_i with dp_i =
dp_replicate_i * dp_shard + dp_shard_i; the pipeline strategy's (pp, dp) and TP's (dp, tp) are the
same order with a degree of 1), and a launcher puts rank r on node r // devices_per_node. Restated
here as arithmetic: plan/ imports no torch (nd.py does); tests/unit/test_plan_nd_layout.py
checks it against nd.mesh_groups.

Whether a group crosses nodes depends on where its ranks land, not on its span alone: with
3 nodes x 8, tp 2, pp 4 (dp 3) the dp group [6, 8, 10] is on nodes 0, 1, 1 although tp x dp = 6
fits in a node. A collective's time is bound by its slowest group (every rank waits for the step),
so a group kind is charged as its worst group: crossing if any of its groups crosses, on the most
nodes any of them spans.
"""
from __future__ import annotations

from functools import lru_cache
from itertools import product

MESH = ("pp", "dp_replicate", "dp_shard", "tp")       # slowest to fastest
_ALONG = {"tp": ("tp",), "dp": ("dp_replicate", "dp_shard"), "dp_shard": ("dp_shard",),
          "dp_replicate": ("dp_replicate",), "pp": ("pp",), "world": MESH}


def _sizes_strides(pp: int, dp: int, tp: int, dp_replicate: int) -> tuple[dict, dict]:
    sizes = {"pp": pp, "dp_replicate": dp_replicate, "dp_shard": dp // dp_replicate, "tp": tp}
    strides = {"tp": 1, "dp_shard": tp, "dp_replicate": tp * sizes["dp_shard"], "pp": tp * dp}
    return sizes, strides


def rank_of(pp_i: int, dp_i: int, tp_i: int, dp: int, tp: int) -> int:
    """Global rank of mesh coordinates (pp_i, dp_i, tp_i) (nd.coordinate_rank)."""
    return (pp_i * dp + dp_i) * tp + tp_i


@lru_cache(maxsize=512)
def group_ranks(group: str, pp: int, dp: int, tp: int, dp_replicate: int = 1) -> tuple[tuple[int, ...], ...]:
    """Every group of kind `group` (tp, dp, dp_shard, dp_replicate, pp, world): the ranks that
    differ only in its mesh dimensions, ordered by the other coordinates (as nd.mesh_groups)."""
    if group not in _ALONG:
        raise ValueError(f"unknown group {group!r}; valid: {', '.join(_ALONG)}")
    sizes, strides = _sizes_strides(pp, dp, tp, dp_replicate)
    along = _ALONG[group]
    fixed = [d for d in MESH if d not in along]
    out = []
    for fc in product(*(range(sizes[d]) for d in fixed)):
        base = sum(c * strides[d] for c, d in zip(fc, fixed))
        out.append(tuple(sorted(base + sum(c * strides[d] for c, d in zip(vc, along))
                                for vc in product(*(range(sizes[d]) for d in along)))))
    return tuple(out)


def nodes_of(ranks, devices_per_node: int) -> int:
    """How many nodes these ranks are on (rank r on node r // devices_per_node)."""
    return len({r // devices_per_node for r in ranks})


@lru_cache(maxsize=512)
def worst_group_nodes(group: str, pp: int, dp: int, tp: int, dp_replicate: int, devices_per_node: int) -> int:
    """The most nodes any one group of kind `group` is on (1: every group inside a node)."""
    return max(nodes_of(g, devices_per_node) for g in group_ranks(group, pp, dp, tp, dp_replicate))


def virtual_stage_ranks(pp: int, stages_per_rank: int) -> list[int]:
    """The pipeline rank of each virtual stage: stage k on rank k % pp (the loop-around placement
    of torch's interleaved schedules, strategies/pipeline_split.py; v = 1: stage k on rank k)."""
    return [k % pp for k in range(pp * stages_per_rank)]


def send_peers(pp: int, stages_per_rank: int) -> list[list[int]]:
    """For each pipeline rank, the pipeline rank each of its sends per micro-batch goes to: one
    forward activation from each of its virtual stages but the last (to the next stage's rank),
    one backward gradient from each but the first (to the previous stage's rank)."""
    owner = virtual_stage_ranks(pp, stages_per_rank)
    last = len(owner) - 1
    peers: list[list[int]] = [[] for _ in range(pp)]
    for k, r in enumerate(owner):
        if k < last:
            peers[r].append(owner[k + 1])
        if k > 0:
            peers[r].append(owner[k - 1])
    return peers


def sends_per_micro_batch(pp: int, stages_per_rank: int) -> list[int]:
    """Sends of each pipeline rank per micro-batch. pp 2, v 1: [1, 1] (rank 0 only sends forward,
    rank 1 only backward); pp 2, v 2: [3, 3]; pp 4, v 1: [1, 2, 2, 1] (a middle rank 2 v)."""
    return [len(p) for p in send_peers(pp, stages_per_rank)]


@lru_cache(maxsize=512)
def worst_rank_sends(pp: int, dp: int, tp: int, stages_per_rank: int, devices_per_node: int) -> tuple[int, int]:
    """(the most sends per micro-batch any rank makes to another node, the most any rank makes).
    Every rank sends to the same tp and dp coordinate of its peer stage, which may or may not be
    on its node. Charging the first at the network's cost and the rest inside a node bounds
    every rank's time (exact when one rank has both maxima, as a middle rank usually does); all
    of them at the network's, as when any rank crossed, over-charged a pipeline whose stages
    share nodes (pp 4 on 2 nodes: only the middle boundary crosses)."""
    peers = send_peers(pp, stages_per_rank)
    cross = 0
    for r in range(pp):
        for d in range(dp):
            for t in range(tp):
                node = rank_of(r, d, t, dp, tp) // devices_per_node
                cross = max(cross, sum(rank_of(q, d, t, dp, tp) // devices_per_node != node for q in peers[r]))
    return cross, max(len(p) for p in peers)


def pp_ends_cross_nodes(pp: int, dp: int, tp: int, devices_per_node: int) -> bool:
    """Whether the first and last stage of some pipeline (a tied embedding's all-reduce pair) are
    on different nodes."""
    return any(rank_of(0, d, t, dp, tp) // devices_per_node != rank_of(pp - 1, d, t, dp, tp) // devices_per_node
               for d in range(dp) for t in range(tp))

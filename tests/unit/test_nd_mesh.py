"""strategy=nd's rank-to-coordinate mapping (pure functions, hand-computed expectations) and its
preflight checks (no rank starts)."""
from __future__ import annotations

import pytest

from scalelab.errors import ConfigError
from scalelab.strategies.nd import ND, coordinate_rank, mesh_groups, rank_coordinates


def test_two_nodes_of_four_devices_put_tp_inside_a_node():
    """tp=2, pp=2, dp=2 on 2 nodes x 4 devices (world 8). tp fastest, then dp, then pp:
    rank = (pp * 2 + dp) * 2 + tp. Node of a rank = rank // 4."""
    want = {0: (0, 0, 0), 1: (0, 0, 1), 2: (0, 1, 0), 3: (0, 1, 1),
            4: (1, 0, 0), 5: (1, 0, 1), 6: (1, 1, 0), 7: (1, 1, 1)}
    for rank, coords in want.items():
        assert rank_coordinates(rank, pp=2, dp=2, tp=2) == coords
        assert coordinate_rank(*coords, dp=2, tp=2) == rank
    groups = mesh_groups(pp=2, dp=2, tp=2)
    # TP groups: consecutive pairs, each on one node (ranks 0,1 on node 0, ...)
    assert groups["tp"] == [[0, 1], [2, 3], [4, 5], [6, 7]]
    assert all(len({r // 4 for r in g}) == 1 for g in groups["tp"])
    # dp: the replicas of one stage with the same tp coordinate, still inside a node
    assert groups["dp"] == [[0, 2], [1, 3], [4, 6], [5, 7]]
    assert all(len({r // 4 for r in g}) == 1 for g in groups["dp"])
    # pp: stage 0 on node 0, stage 1 on node 1; the activations cross the node boundary
    assert groups["pp"] == [[0, 4], [1, 5], [2, 6], [3, 7]]
    assert all([r // 4 for r in g] == [0, 1] for g in groups["pp"])


def test_plan_uses_the_mapping_for_data_and_loss():
    plan = ND(tp=2, pp=2)
    # data-parallel rank = dp coordinate: TP peers read the same samples
    assert [plan.dp_rank(r, 8) for r in range(8)] == [0, 0, 1, 1, 0, 0, 1, 1]
    assert plan.loss_ranks(8) == [4, 5, 6, 7]              # the last stage's ranks
    assert plan.parallel_degrees(8) == {"dp": 2, "tp": 2, "pp": 2}
    assert ND(tp=2, pp=2).loss_ranks(4) == [2, 3]
    assert ND(tp=1, pp=1).loss_ranks(4) == [0, 1, 2, 3]
    with pytest.raises(ValueError):
        rank_coordinates(8, 2, 2, 2)


def test_degenerate_meshes():
    assert mesh_groups(1, 4, 1)["dp"] == [[0, 1, 2, 3]]
    assert mesh_groups(4, 1, 1)["pp"] == [[0, 1, 2, 3]]
    assert mesh_groups(1, 1, 4)["tp"] == [[0, 1, 2, 3]]


@pytest.mark.parametrize("args, words", [
    (["trainer.devices=4", "strategy.tp=3"], ["tp x pp = 3 x 1 = 3 does not divide the world size 4"]),
    (["trainer.devices=8", "strategy.tp=8"], ["strategy.tp=8 does not divide model n_heads 4"]),
    (["trainer.devices=8", "strategy.tp=2", "strategy.pp=4"], ["strategy.pp=4", "2 layers"]),
    (["trainer.devices=4", "strategy.tp=2", "strategy.pp=2", "strategy.microbatches=1"], ["1f1b", ">= 2"]),
    (["trainer.devices=4", "strategy.pp=2", "strategy.microbatches=3"], ["microbatches=3", "8"]),
    (["trainer.devices=4", "strategy.pp=2", "data.micro_batch_size=4"], ["data.micro_batch_size"]),
    (["trainer.devices=4", "strategy.pp=2", "trainer.precision=16-mixed"], ["16-mixed", "bf16-mixed"]),
    (["trainer.devices=4", "model=mlp"], ["GPT"]),
    (["trainer.devices=4", "strategy.dp_replicate=3"], ["dp_replicate=3", "data-parallel degree 4"]),
    (["trainer.devices=4", "strategy.tp=0"], ["strategy.tp=0"]),
    # TP inside a node: 2 nodes of 2 devices cannot hold a TP group of 4
    (["trainer.devices=2", "trainer.num_nodes=2", "launcher=srun", "strategy.tp=4"],
     ["strategy.tp=4 cannot fit inside a node of 2 device(s)"]),
])
def test_bad_nd_setups_fail_in_one_line_before_any_rank(args, words):
    from scalelab.preflight import preflight

    with pytest.raises(ConfigError) as e:
        preflight(["strategy=nd", "trainer.accelerator=cpu", *args])
    msg = str(e.value)
    assert "\n" not in msg
    for w in words:
        assert w in msg, msg


@pytest.mark.parametrize("args", [
    ["trainer.devices=4", "strategy.tp=2", "strategy.pp=2"],
    ["trainer.devices=8", "strategy.tp=2", "strategy.pp=2"],
    ["trainer.devices=4", "strategy.pp=2", "strategy.schedule=gpipe", "strategy.microbatches=8"],
    ["trainer.devices=4", "strategy.tp=2", "trainer.precision=bf16-mixed"],
    ["trainer.devices=4", "strategy.dp_replicate=2"],
    ["trainer.devices=1"],
])
def test_good_nd_setups_pass_preflight(args):
    from scalelab.preflight import preflight

    assert preflight(["strategy=nd", "trainer.accelerator=cpu", *args]) == 1


def test_planner_reads_the_same_layout_from_flags_and_from_the_config():
    """`scalelab plan --strategy nd --tp 2 --pp 2 --devices 4` and `scalelab plan strategy=nd
    strategy.tp=2 strategy.pp=2 trainer.devices=4` describe the same layout."""
    from scalelab.plan.spec import STRATEGIES, ModelSpec, get_strategy, resolve_layout
    from scalelab.plan_job import terms_for_job

    st = STRATEGIES["nd"]
    assert st.shard_params and st.shard_grads and st.shard_optimizer and st.tensor_parallel and st.pipeline
    nano = ModelSpec.from_shape(2, 64, 4, 256, 64, 256)
    flags = resolve_layout(get_strategy("nd"), nano, devices=4, tp=2, pp=2, micro_batch=4, global_batch=16)
    terms, _ = terms_for_job(["strategy=nd", "strategy.tp=2", "strategy.pp=2", "trainer.devices=4",
                              "model=gpt_nano"])
    job = terms.layout
    assert (flags.dp, flags.tp, flags.pp) == (job.dp, job.tp, job.pp) == (1, 2, 2)
    assert (flags.micro_batch, flags.micro_batches) == (job.micro_batch, job.micro_batches) == (4, 4)
    # the config's own tp/pp are the planner's defaults for --strategy nd
    cfg = get_strategy("nd", {"tp": 2, "pp": 2})
    assert resolve_layout(cfg, nano, devices=8) == resolve_layout(cfg, nano, devices=8, tp=2, pp=2)

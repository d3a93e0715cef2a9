"""Meta-device init (strategies/materialize.py) on 4 real gloo ranks (tests/integration/meta_init_probe.py,
one torchrun job, ~10 s): the sharding strategies build the GPT on the meta device, cut it, and
allocate only their own part; every parameter must equal the eagerly built GPT's (the weights
`single` starts from), and each rank must hold exactly its share.

Hand count for the probe's GPT (L = 4 layers, d = 72, MLP 4d = 288, vocab 256, context 40), in
parameters:
  tok_emb 256 x 72 = 18,432; pos_emb 40 x 72 = 2,880; lm_head 18,432; ln_f 144
  one block: q, k, v, out 4 x 72^2 = 20,736; up + down 2 x 72 x 288 = 41,472; ln1 + ln2 288
             = 62,496; four blocks 249,984
  whole model: 289,872 parameters = 1,159,488 bytes in fp32
  fsdp over 4: every dim 0 (256, 40, 72, 288) divides by 4 -> 289,872 bytes per rank
  tp over 4: q, k, v, out, up, down and both vocab matrices / 4 = (4 x 62,208 + 2 x 18,432) / 4
             = 71,424; replicated pos_emb + 9 LayerNorms = 2,880 + 1,296 = 4,176 -> 75,600 x 4 = 302,400
  fsdp_tp, mesh (dp, tp) = (2, 2): TP over 2 leaves (4 x 62,208 + 2 x 18,432) / 2 + 4,176
             = 147,024 per tp rank (588,096 bytes), which FSDP splits over the 2 dp ranks
  pipeline, 4 stages of one block: rank 0 block + tok_emb + pos_emb = 83,808 (335,232 bytes);
             ranks 1, 2 one block = 62,496 (249,984 bytes); rank 3 block + ln_f + lm_head = 81,072
             (324,288 bytes)
"""
from __future__ import annotations

from pathlib import Path

import pytest

from ..conftest import torchrun_probe

pytestmark = pytest.mark.integration

BLOCK = 4 * 72 * 72 + 2 * 72 * 288 + 4 * 72
MODEL = 256 * 72 + 40 * 72 + 4 * BLOCK + 2 * 72 + 256 * 72
HAND_BYTES = {
    "fsdp": [MODEL * 4 // 4] * 4,
    "tp": [((4 * (4 * 72 * 72 + 2 * 72 * 288) + 2 * 256 * 72) // 4 + 40 * 72 + 9 * 2 * 72) * 4] * 4,
    "pipeline": [(BLOCK + 256 * 72 + 40 * 72) * 4, BLOCK * 4, BLOCK * 4, (BLOCK + 2 * 72 + 256 * 72) * 4],
}


@pytest.fixture(scope="module")
def probe(tmp_path_factory) -> list[dict]:
    return torchrun_probe(Path(__file__).with_name("meta_init_probe.py"), 4, tmp_path_factory.mktemp("meta_init_probe"))


def test_hand_count_of_the_probe_model():
    assert BLOCK == 62_496 and MODEL == 289_872


@pytest.mark.parametrize("shape", ["even", "uneven"])
@pytest.mark.parametrize("layout", ["fsdp", "tp", "fsdp_tp", "pipeline"])
def test_materialized_shards_equal_the_eager_model(probe, layout, shape):
    for r, ranks in enumerate(probe):
        got = ranks[f"{layout}@{shape}"]
        assert got["meta_before"], f"rank {r}: parameters were allocated before materialize"
        assert got["max_abs_diff"] == 0.0, (r, got["max_abs_diff"])
        assert got["devices"] == ["cpu"]


@pytest.mark.parametrize("layout", ["fsdp", "tp", "pipeline"])
def test_each_rank_holds_its_share_only(probe, layout):
    assert [ranks[f"{layout}@even"]["local_bytes"] for ranks in probe] == HAND_BYTES[layout]


def test_fsdp_tp_ranks_hold_the_tp_shard_split_over_dp(probe):
    """Mesh (dp, tp) = (2, 2), rank = dp_index x 2 + tp_index: the two dp ranks of one tp index
    together hold that tp rank's whole shard, 147,024 parameters (module docstring)."""
    tp_rank_bytes = ((4 * (4 * 72 * 72 + 2 * 72 * 288) + 2 * 256 * 72) // 2 + 40 * 72 + 9 * 2 * 72) * 4
    assert tp_rank_bytes == 588_096
    for tp_index in (0, 1):
        assert sum(probe[dp * 2 + tp_index]["fsdp_tp@even"]["local_bytes"] for dp in (0, 1)) == tp_rank_bytes


def test_pipeline_stage_keeps_only_its_parameters(probe):
    assert "tok_emb.weight" in probe[0]["pipeline@even"]["names"]
    assert "lm_head.weight" in probe[3]["pipeline@even"]["names"]
    for r in range(4):
        layers = {n.split(".")[1] for n in probe[r]["pipeline@even"]["names"] if n.startswith("layers.")}
        assert layers == {str(r)}

import pytest

from scalelab.data.sampler import GlobalBatchSampler
from scalelab.errors import ConfigError
from scalelab.scaling.batch import derive_batch


def test_derive_batch_without_and_with_accumulation():
    assert derive_batch(16, 2) == derive_batch(16, 2, 8)
    b = derive_batch(32, 2, 4)
    assert (b.per_device_batch_size, b.accumulate_grad_batches) == (4, 4)


@pytest.mark.parametrize("g,dp,m", [(15, 2, None), (16, 3, None), (16, 2, 3), (0, 1, None)])
def test_bad_batches_name_the_value(g, dp, m):
    with pytest.raises(ConfigError, match=rf"global_batch_size={g}|micro_batch_size"):
        derive_batch(g, dp, m)


@pytest.mark.parametrize("world,micro", [(2, 8), (2, 4), (4, 2), (2, 2)])
def test_every_world_size_sees_the_same_global_batches(world, micro):
    B, n = 16, 200
    single = list(GlobalBatchSampler(n, B, B, 0, 1, seed=7))
    ranks = [list(GlobalBatchSampler(n, B, micro, r, world, seed=7)) for r in range(world)]
    per_step_rank = B // world
    for step in range(n // B):
        union = sorted(i for r in ranks for i in r[step * per_step_rank:(step + 1) * per_step_rank])
        assert union == sorted(single[step * B:(step + 1) * B])
    assert all(len(set(r)) == len(r) for r in ranks)  # distinct samples within a rank
    assert not set(ranks[0]) & set(ranks[1])  # and across ranks


def test_same_seed_same_order_other_seed_other_order():
    a = list(GlobalBatchSampler(100, 8, 8, 0, 1, seed=1))
    assert a == list(GlobalBatchSampler(100, 8, 8, 0, 1, seed=1))
    assert a != list(GlobalBatchSampler(100, 8, 8, 0, 1, seed=2))


def test_no_two_seeds_share_an_epochs_shuffle():
    """With seed + epoch as the generator's seed, seed 1's second epoch was seed 2's first."""
    def order(seed, epoch):
        s = GlobalBatchSampler(100, 10, 10, 0, 1, seed=seed)
        s.set_epoch(epoch)
        return list(s)

    orders = [order(seed, epoch) for seed in range(4) for epoch in range(4)]
    assert all(len(o) == 100 for o in orders)
    assert len({tuple(o) for o in orders}) == 16


def test_resume_continues_with_the_next_global_batch_even_if_lightning_counts_an_epoch_ahead():
    full = list(GlobalBatchSampler(100, 8, 8, 0, 1, seed=3))
    resumed = GlobalBatchSampler(100, 8, 8, 0, 1, seed=3, start_step=5, lightning_epoch=1)
    resumed.set_epoch(1)  # what Lightning does after a max_steps stop + resume
    assert list(resumed)[:16] == full[5 * 8: 7 * 8]

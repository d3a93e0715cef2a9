"""A sampler that makes every world size see the same global batches.

Optimizer step s consumes global batch perm[s*B : (s+1)*B] (one seeded permutation per epoch).
Rank r of D data-parallel ranks, micro-batch m, accumulation A (B = D*m*A) takes micro-batch k
of step s from perm[s*B + (k*D + r)*m : ... + m]. So `single` at batch B and DDP at D ranks
average the gradient over exactly the same B samples: the runs are comparable step for step.
Lightning's own DistributedSampler would interleave differently per world size, so it is
turned off (Trainer(use_distributed_sampler=False)).
"""
from __future__ import annotations

from collections.abc import Iterator

import torch
from torch.utils.data import Sampler


class GlobalBatchSampler(Sampler[int]):
    def __init__(self, num_samples: int, global_batch: int, micro_batch: int, dp_rank: int,
                 dp_size: int, seed: int, shuffle: bool = True, start_step: int = 0,
                 lightning_epoch: int | None = None):
        if global_batch % (micro_batch * dp_size):
            raise ValueError(f"global batch {global_batch} is not a multiple of micro batch "
                             f"{micro_batch} x {dp_size} data-parallel ranks")
        self.n, self.B, self.m = num_samples, global_batch, micro_batch
        self.rank, self.D, self.seed, self.shuffle = dp_rank, dp_size, seed, shuffle
        self.A = global_batch // (micro_batch * dp_size)
        self.steps = num_samples // global_batch
        if self.steps == 0:
            raise ValueError(f"global batch {global_batch} is larger than the dataset ({num_samples} samples)")
        # start_step: optimizer steps already taken (resume); it picks the epoch and the offset in it.
        self.epoch, self.first = divmod(start_step, self.steps)
        # Lightning calls set_epoch(trainer.current_epoch) before it iterates. After a resume its
        # count can run ahead of ours: a run stopped by max_steps counts its unfinished epoch as
        # completed, so the resumed run would call set_epoch(1) and restart from epoch 1's first
        # batch. Lightning's epoch numbers are translated by the offset seen at construction.
        self._epoch_offset = 0 if lightning_epoch is None else self.epoch - lightning_epoch

    def set_epoch(self, epoch: int) -> None:
        epoch += self._epoch_offset
        if epoch != self.epoch:  # a new epoch starts from its first step
            self.epoch, self.first = epoch, 0

    def __len__(self) -> int:
        # The whole epoch, also when a resume starts part-way into it (__iter__ skips the steps
        # done): Lightning counts the restored in-epoch batches as already fetched and ends the
        # epoch at len(loader) batches, and never re-reads the length for later epochs. A
        # shortened length made it end every epoch `first` steps early, skipping those batches.
        return self.steps * self.A * self.m

    def __iter__(self) -> Iterator[int]:
        if self.shuffle:
            # not seed + epoch: seed 1's second epoch would be seed 2's first, and a seed sweep
            # over several epochs would share its shuffles across runs
            g = torch.Generator().manual_seed((self.seed * 2_654_435_761 + self.epoch) % 2 ** 63)
            perm = torch.randperm(self.n, generator=g)
        else:
            perm = torch.arange(self.n)
        for s in range(self.first, self.steps):
            for k in range(self.A):
                start = s * self.B + (k * self.D + self.rank) * self.m
                yield from perm[start: start + self.m].tolist()

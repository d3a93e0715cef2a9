"""What a parallel degree can split, for the plan and scalelab-train alike ("the plan is the run"):
the GPT dimensions a tensor-parallel degree leaves undivided, the padded vocabulary that would
divide, the sequence-parallel shard check, and the pipeline schedules' constraints. Each refusal is
one line naming the bad value and the valid ones (PlanError)."""
from __future__ import annotations

import math
from dataclasses import replace
from typing import TYPE_CHECKING

from .base import PlanError

if TYPE_CHECKING:
    from .spec import ModelSpec


def _divisors(n: int) -> list[int]:
    return [d for d in range(1, n + 1) if n % d == 0]


def tp_indivisible(model: ModelSpec, tp: int) -> list[tuple[str, int]]:
    """The dimensions of a GPT that `tp` does not divide, named as scalelab-train's preflight names
    them (strategies/tensor_parallel.check_tp_degree: the q/k/v/out and MLP Linears are split by
    heads and width, the embedding and head along the vocabulary)."""
    sizes = (("model n_heads", model.heads), ("model d_model", model.hidden), ("MLP width", model.ffn),
             ("vocab_size", model.vocab))
    return [(what, v) for what, v in sizes if v % tp]


def padded_vocab(vocab: int, tp: int) -> int:
    """The vocabulary padded up to a multiple of 128 (GPT-2's 50257 -> 50304, as nanoGPT and Megatron
    pad it), or of tp when 128 is not one of tp's multiples."""
    step = 128 if 128 % tp == 0 else tp
    return -(-vocab // step) * step


def check_tp_splits(model: ModelSpec, tp: int, world: int, strategy: str) -> None:
    """The trainer refuses a TP degree that does not divide the heads, width, MLP width or vocab
    (strategy=tp with vocab 50257 at tp 8): so does the plan, with the trainer's reason, so that
    the printed same job runs ("the plan is the run"). The valid degrees: the world's divisors that
    tp_indivisible passes (every dimension, as check_tp_degree's list), and those a padded
    vocabulary adds."""
    bad = tp_indivisible(model, tp)
    if not bad:
        return
    what, v = bad[0]
    valid = [d for d in _divisors(world) if not tp_indivisible(model, d)]
    # each degree with the vocabulary padded for it (padded for the asked tp alone, a tp that does
    # not divide the world, 3 of 8 devices, hid 2 and 4), then one padding that serves them all
    extra = [d for d in _divisors(world) if d not in valid
             and not tp_indivisible(replace(model, vocab=padded_vocab(model.vocab, d)), d)]
    step = math.lcm(128, *extra) if extra else 1    # 128 as nanoGPT and Megatron pad (50257 -> 50304)
    pv = -(-model.vocab // step) * step
    listed = ", ".join(map(str, valid)) + (" (no tensor parallelism)" if valid == [1] else "")
    hint = (f", or {', '.join(map(str, extra))} with a vocabulary {'they divide' if len(extra) > 1 else 'it divides'} "
            f"(padded: --vocab / model.arch.vocab_size {pv})" if extra else "")
    if what == "model n_heads":     # the message the flag form always gave for the heads
        raise PlanError(f"--tp {tp} does not divide --heads {model.heads}; valid tp: {listed}{hint}")
    raise PlanError(f"strategy={strategy}: tp {tp} does not divide {what} {v}: scalelab-train splits the "
                    f"{'embedding and head along the vocabulary' if what == 'vocab_size' else what} {tp} ways; "
                    f"valid tp: {listed}{hint}")


def check_sequence_length(model: ModelSpec, tp: int, world: int, strategy: str) -> None:
    """Sequence parallel (the plan's default, strategy.sequence_parallel=true in its same job) cuts
    each sequence into tp equal shards: the trainer's check_sequence_length (strategies/
    tensor_parallel.py) refuses a seq_len tp does not divide; so does the plan, with its reason."""
    if model.kind == "gpt" and tp > 1 and model.seq_len % tp:
        valid = [d for d in _divisors(world) if not tp_indivisible(model, d) and model.seq_len % d == 0]
        raise PlanError(f"strategy={strategy}: sequence parallel shards each sequence of seq_len {model.seq_len} "
                        f"over tp {tp} ranks, which does not divide it (scalelab-train's check): valid tp: "
                        f"{', '.join(map(str, valid))}; or a --seq-len tp divides, or --no-sequence-parallel "
                        "(strategy.sequence_parallel=false)")


def pipeline_schedule_refusal(schedule: str, pp: int, m: int, v: int, n_layers: int,
                              what: str = "pipeline stages") -> str | None:
    """Why scalelab-train refuses a pipeline schedule (None: it runs it), for the trainer
    (strategies.pipeline.Pipeline._check_schedule, pipeline and nd) and the plan alike: the
    constraints of torch.distributed.pipelining's schedules. schedule: gpipe | 1f1b |
    interleaved_1f1b; m: micro-batches per step; v: the configured stages_per_rank; what: the
    stages, as the message names them."""
    if schedule == "1f1b" and m < pp:
        return (f"strategy.microbatches={m} is fewer than the {pp} {what}, which schedule=1f1b needs "
                f"at least: use >= {pp} micro-batches or schedule=gpipe")
    if v > 1 and pp * v > n_layers:
        most = n_layers // pp   # 1 (or 0) is no interleaving: that schedule needs stages_per_rank >= 2
        fix = (f"use stages_per_rank <= {most} or raise model.arch.n_layers" if most >= 2 else
               f"use schedule=1f1b or gpipe (stages_per_rank=1), or model.arch.n_layers >= {2 * pp}")
        return f"strategy.stages_per_rank={v}: {pp} x {v} = {pp * v} virtual stages but the model has {n_layers} layers: {fix}"
    if v > 1 and pp < 2:
        return f"strategy.schedule=interleaved_1f1b needs >= 2 {what}, got {pp}"
    rounds = max(1, m // pp)
    if v > 1 and m % rounds:
        # ScheduleInterleaved1F1B: rounds = max(1, m // pp) must divide m
        ok = [x for x in range(1, 4 * pp + 1) if x % max(1, x // pp) == 0]
        return (f"strategy.microbatches={m} with interleaved_1f1b over {pp} {what}: torch's schedule runs "
                f"max(1, m // {pp}) = {rounds} rounds, which must divide m: choose one of "
                f"{', '.join(map(str, ok))} (or another multiple of {pp})")
    return None

"""When the data-parallel replicas of `tp` and `pipeline` all-reduce their gradients, in real runs
(scalelab-train, gloo, gpt_nano, fp32, SGD), against the planner's count (plan/comm.py).

- tp at 2 ranks with tensor_parallel_size 1 (dp 2), micro-batch 4 of 8 per rank: 2 accumulated
  micro-batches a step. FSDP2's replicate per Block and the root (tensor_parallel.apply_replicate)
  all-reduces each unit once a step, in the last micro-batch's backward (the strategy's
  block_backward_sync turns the sync off while Lightning accumulates): 3 calls, none in the
  first micro-batch, Block 1's before Block 0's backward starts. The root-only replicate
  all-reduced once per micro-batch, after the whole backward: 2 a step where the planner had 1.
- pipeline at 2 ranks with dp 2 (one stage, 4 micro-batches): each replica's stage is a DDP
  module, so torch's PipelineStage reduces DDP's bucket (one for gpt_nano: 543 KB < its 1 MiB
  first bucket) inside the last micro-batch's backward. Before, the plan all-reduced a flat copy of
  the gradients after the schedule had returned: after every backward, never overlapped, where
  the planner counts an overlappable DDP all-reduce.
Both stay the same computation as `single` on the whole batch (the module's multirun has one).

The probes (ProbedTP, ProbedPipeline: the real plans, selected with strategy._target_) write per
rank $DP_SYNC_PROBE_OUT/<tag>_rank{r}.json, rewritten at each event:
- tp: ("micro",) at each training forward, ("bwd", i) when Block i's backward starts, ("reduce",
  elements) per FSDP2 gradient reduce (foreach_reduce; replicate: one all-reduce over dp);
- pipeline: ("bwd", last_backward) / ("bwd_end",) around each micro-batch's stage backward,
  ("reduce", elements) per all-reduce over the dp group inside the training step (DDP's buckets
  too: a comm hook that runs DDP's default all-reduce through dist.all_reduce), ("step",) at its end.
"""
from __future__ import annotations

import json
import os

import pytest

from scalelab.strategies.pipeline import Pipeline
from scalelab.strategies.tensor_parallel import TensorParallel

from ..conftest import assert_same_curve, read_record, run_jobs

pytestmark = pytest.mark.integration

OUT = "DP_SYNC_PROBE_OUT"
REL = 1e-4          # fp32 sums reordered only (tests/integration/test_fsdp_tp.py's tolerance)
STEPS = 6
NANO = dict(n_layers=2, d_model=64, n_heads=4, vocab_size=256, seq_len=64)
# gpt_nano by hand: a Block 4 x 64 x 64 + 2 x 64 x 256 + 4 x 64 = 49,408; the root 2 x 256 x 64
# (embedding, head) + 64 x 64 (positions) + 2 x 64 (final LayerNorm) = 36,992; 135,808 in all
BLOCK, ROOT = 49_408, 36_992


def _recorder(tag: str):
    import torch.distributed as dist

    path = os.path.join(os.environ[OUT], f"{tag}_rank{dist.get_rank()}.json")
    events: list = []

    def record(*event) -> None:
        events.append(event)
        with open(path, "w") as f:
            json.dump(events, f)

    return record


class ProbedTP(TensorParallel):
    def parallelize(self, net, device_mesh):
        import torch
        from torch.distributed.fsdp._fully_shard import _fsdp_param_group as pg

        from scalelab.models.gpt import Block

        net = super().parallelize(net, device_mesh)
        record = _recorder("tp")
        net.register_forward_pre_hook(lambda mod, args: record("micro") if torch.is_grad_enabled() else None)
        for i, block in enumerate(m for m in net.modules() if isinstance(m, Block)):
            def on_output(mod, args, out, i=i):
                if out.requires_grad:
                    out.register_hook(lambda g: record("bwd", i))
            block.register_forward_hook(on_output)
        real = pg.foreach_reduce

        def reduce(params, grads, *a, **k):
            record("reduce", sum(g.numel() for g in grads))
            return real(params, grads, *a, **k)
        pg.foreach_reduce = reduce
        return net


class ProbedPipeline(Pipeline):
    def _build_schedule(self, pl_module) -> None:
        import torch.distributed as dist
        from torch.distributed.algorithms.ddp_comm_hooks import default_hooks
        from torch.nn.parallel import DistributedDataParallel

        super()._build_schedule(pl_module)
        record = self._record = _recorder("pipeline")
        stages = getattr(self._schedule, "_stages", None) or [self._schedule._stage]
        for stage in stages:
            backward = stage.backward_one_chunk

            def timed(*a, backward=backward, **k):
                record("bwd", bool(k.get("last_backward")))
                out = backward(*a, **k)
                record("bwd_end")
                return out
            stage.backward_one_chunk = timed
            if isinstance(stage.submod, DistributedDataParallel):
                # DDP's own reducer all-reduces in C++; its default hook does the same through
                # dist.all_reduce, where the patch below sees it
                stage.submod.register_comm_hook(self._dp_group, default_hooks.allreduce_hook)
        real, group = dist.all_reduce, self._dp_group

        def all_reduce(t, *a, **k):   # over the dp group, in a training step (not Lightning's own)
            if self._in_step and k.get("group") is group:
                record("reduce", t.numel())
            return real(t, *a, **k)
        dist.all_reduce = all_reduce

    def training_step(self, pl_module, batch, batch_idx):
        self._in_step = True
        try:
            return super().training_step(pl_module, batch, batch_idx)
        finally:
            self._in_step = False
            self._record("step")


def _planned(strategy: str, options: dict, micro_batches: int) -> list:
    """The planner's data-parallel gradient all-reduce for the job (dp 2, gpt_nano, fp32, CPU)."""
    from scalelab.plan import ModelSpec, get_strategy, resolve_layout
    from scalelab.plan.comm import collectives
    from scalelab.plan.strategies import as_applied

    model = ModelSpec.from_shape(NANO["n_layers"], NANO["d_model"], NANO["n_heads"], NANO["vocab_size"],
                                 NANO["seq_len"], n_params=ModelSpec.trainer_gpt_params(
                                     NANO["n_layers"], NANO["d_model"], NANO["vocab_size"], NANO["seq_len"]))
    st = get_strategy(strategy, options)
    lay = resolve_layout(st, model, 2, tp=1, pp=1, micro_batch=16 // 2 // micro_batches, global_batch=16)
    assert (lay.dp, lay.micro_batches) == (2, micro_batches)
    return [c for c in collectives(model, as_applied(st, lay.dp), lay, "32", "cpu") if c.group == "dp"]


@pytest.fixture(scope="module")
def jobs(tmp_path_factory):
    out = tmp_path_factory.mktemp("dp_sync_probe")
    os.environ[OUT] = str(out)   # the jobs' ranks inherit it (conftest.env copies the environment)
    try:
        common = [f"trainer.max_steps={STEPS}", "trainer.warmup_steps=1", "trainer.profile_steps=0"]
        dirs = run_jobs(tmp_path_factory, "dp_sync", {
            "single": ["strategy=single", "trainer.devices=1", *common],
            "tp": ["strategy=tp", f"strategy._target_={__name__}.ProbedTP", "strategy.tensor_parallel_size=1",
                   "trainer.devices=2", "data.micro_batch_size=4", *common],
            "pipeline": ["strategy=pipeline", f"strategy._target_={__name__}.ProbedPipeline", "strategy.dp=2",
                         "trainer.devices=2", *common]})
    finally:
        del os.environ[OUT]
    return {name: read_record(d) for name, d in dirs.items()}, out


def _events(out, tag: str, rank: int) -> list:
    return [tuple(e) for e in json.loads((out / f"{tag}_rank{rank}.json").read_text())]


def _split(events: list, marker: str, before: bool) -> list[list]:
    """The events cut at each `marker` (which starts a part if `before`, else ends one)."""
    parts: list[list] = [[]]
    for e in events:
        if e[0] == marker and before:
            parts.append([])
        if e[0] != marker:
            parts[-1].append(e)
        elif not before:
            parts.append([])
    return [p for p in parts if p]


def test_tp_replicas_sync_each_block_once_per_step(jobs):
    recs, out = jobs
    rec = recs["tp"]
    assert rec["status"] == "completed" and rec["parallel"] == {"dp": 2, "tp": 1, "pp": 1}
    assert rec["accumulate_grad_batches"] == 2
    planned = _planned("tp", {"tensor_parallel_size": 1}, 2)
    assert [(c.name, c.calls, c.overlappable) for c in planned] == [("dp_grad_all_reduce", 3, True)]
    assert planned[0].bytes_per_call * planned[0].calls == 4 * (2 * BLOCK + ROOT)
    for rank in range(2):
        micro = _split(_events(out, "tp", rank), "micro", before=True)
        assert len(micro) == 2 * STEPS, (rank, micro)
        for step in range(STEPS):
            first, last = micro[2 * step], micro[2 * step + 1]
            assert [e for e in first if e[0] == "reduce"] == [], (rank, step, first)
            # Block 1's all-reduce as soon as its backward is done, before Block 0's backward starts
            assert last == [("bwd", 1), ("reduce", BLOCK), ("bwd", 0), ("reduce", BLOCK), ("reduce", ROOT)], \
                (rank, step, last)
            assert sum(e[0] == "reduce" for e in first + last) == planned[0].calls


def test_pipeline_replicas_reduce_inside_the_last_backward(jobs):
    recs, out = jobs
    rec = recs["pipeline"]
    assert rec["status"] == "completed" and rec["parallel"] == {"dp": 2, "tp": 1, "pp": 1}
    planned = _planned("pipeline", {}, 4)
    assert [(c.name, c.calls, c.overlappable) for c in planned] == [("dp_grad_all_reduce", 1, True)]
    assert planned[0].bytes_per_call == 4 * (2 * BLOCK + ROOT)
    for rank in range(2):
        steps = _split(_events(out, "pipeline", rank), "step", before=False)
        assert len(steps) == STEPS, (rank, steps)
        for i, step in enumerate(steps):
            # the schedule's 4 micro-batch backwards, the last one reducing the one bucket while
            # it runs (DDP's reducer, armed by torch's PipelineStage for the last backward only)
            assert step == [("bwd", False), ("bwd_end",)] * 3 + [
                ("bwd", True), ("reduce", 2 * BLOCK + ROOT), ("bwd_end",)], (rank, i, step)
            assert sum(e[0] == "reduce" for e in step) == planned[0].calls


@pytest.mark.parametrize("name", ["tp", "pipeline"])
def test_same_curve_as_single(jobs, name):
    recs, _ = jobs
    assert_same_curve(recs[name], recs["single"], range(1, STEPS + 1), REL)


@pytest.mark.slow
def test_interleaved_pipeline_replicas_match_single_and_resume(tmp_path_factory):
    """pp 2 x 2 virtual stages x dp 2 (4 ranks, 4-layer gpt_nano): every chunk its own DDP module
    over its stage's dp group; 6 steps, then a new job resumes the checkpoint (the DDP modules are
    built after it is loaded) to step 10: the same curve as `single` on that model."""
    model = ["model.arch.n_layers=4", "trainer.warmup_steps=1", "trainer.profile_steps=0"]
    pipe = ["strategy=pipeline", "trainer.devices=4", "strategy.dp=2", "strategy.schedule=interleaved_1f1b",
            "strategy.stages_per_rank=2", *model]
    first = run_jobs(tmp_path_factory, "ilv_dp2", {
        "single": ["strategy=single", "trainer.devices=1", "trainer.max_steps=10", *model],
        "saved": [*pipe, "trainer.max_steps=6", "checkpoint.save=true"]})
    ckpt = first["saved"] / "checkpoints" / "last.ckpt"
    resumed = run_jobs(tmp_path_factory, "ilv_dp2_resumed", {
        "resumed": [*pipe, "trainer.max_steps=10", f"checkpoint.resume_from={ckpt}"]})["resumed"]
    single, saved = read_record(first["single"]), read_record(first["saved"])
    assert saved["parallel"] == {"dp": 2, "tp": 1, "pp": 2}
    assert_same_curve(saved, single, range(1, 7), REL)
    assert_same_curve(read_record(resumed), single, range(7, 11), REL)

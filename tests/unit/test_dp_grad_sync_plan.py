"""The data-parallel gradient sync of `tp` at dp > 1, counted in one process on torch's fake
process group against the planner, and the fused-AdamW choice of plans that clip themselves.

tp at dp > 1 (strategies/tensor_parallel.py apply_replicate): FSDP2's replicate per Block, then the
root, so each Block's gradients are all-reduced as soon as its backward is done (the overlap DDP
gets from its buckets), and under gradient accumulation Lightning's block_backward_sync (here the
strategy that the plan hands Lightning) turns the replicas' sync off for every micro-batch but the
last. The root alone all-reduced every gradient in one call after the whole backward, on every
micro-batch: 2 calls a step at accumulate 2, where the planner counted 1 (DDP's buckets, no_sync).

Hand count (L 2, h 32, V 64, s 8, 2 heads, fp32): a Block holds 4 x 32 x 32 + 2 x 32 x 128 = 12,288
matrix and 4 x 32 = 128 LayerNorm parameters, the root 64 x 32 x 2 (embedding, head) + 8 x 32 + 64
= 4,416: 29,248 in all. At tp 2 a rank all-reduces 6,144 + 128 = 6,272 per Block and 2,048 + 256 +
64 = 2,368 for the root (the LayerNorms and positions whole): 14,912 elements, 3 calls, once a step.
"""
from __future__ import annotations

import contextlib
import functools
import warnings
from dataclasses import replace
from types import SimpleNamespace

import pytest

torch = pytest.importorskip("torch")
dist = pytest.importorskip("torch.distributed")

from scalelab.models.gpt import GPT, Block, GPTConfig  # noqa: E402
from scalelab.plan import ModelSpec, get_strategy, resolve_layout  # noqa: E402
from scalelab.plan.comm import collectives  # noqa: E402
from scalelab.plan.strategies import as_applied  # noqa: E402

CFG = GPTConfig(n_layers=2, n_heads=2, d_model=32, seq_len=8, vocab_size=64)
MICRO = 2                                             # accumulate_grad_batches
BY_HAND = {1: [12_416, 12_416, 4_416], 2: [6_272, 6_272, 2_368]}   # elements per all-reduce, by tp


@pytest.fixture
def fake_world():
    """A fake process group of `world` ranks (this process is rank 0; collectives return at once)."""
    from torch.testing._internal.distributed.fake_pg import FakeStore

    if dist.is_initialized():
        pytest.skip("a process group is already initialised in this process")

    def init(world: int):
        dist.init_process_group("fake", store=FakeStore(), rank=0, world_size=world)

    yield init
    if dist.is_initialized():
        dist.destroy_process_group()


def _run_accumulating(init, monkeypatch, tp: int, sp: bool) -> list[list[tuple]]:
    """Events of each of MICRO micro-batches of the real `tp` plan at dp 2, the first ones inside
    the Lightning strategy's block_backward_sync as Lightning's loop enters it: ("bwd", i) when
    Block i's backward starts, ("dp", numel) per all-reduce over the data-parallel group,
    ("tp_norm",) per all-reduce of a sequence-parallel LayerNorm gradient over the TP group."""
    import torch.nn.functional as F
    from torch.distributed.device_mesh import init_device_mesh
    from torch.utils._python_dispatch import TorchDispatchMode

    from scalelab.strategies.tensor_parallel import TensorParallel

    init(2 * tp)
    torch.manual_seed(0)
    mesh = init_device_mesh("cpu", (2, tp), mesh_dim_names=("data_parallel", "tensor_parallel"))
    plan = TensorParallel(tensor_parallel_size=tp, sequence_parallel=sp)
    strategy = plan.lightning_strategy(SimpleNamespace(precision="32-true", world_size=2 * tp))
    net = plan.parallelize(GPT(CFG), mesh)
    strategy.model = net   # ModelParallelStrategy trains the (unwrapped) LightningModule: here the net
    dp_group, tp_name = mesh["data_parallel"].get_group(), mesh["tensor_parallel"].get_group().group_name
    events: list[tuple] = []
    real = dist.all_reduce

    def all_reduce(t, *a, group=None, **k):   # FSDP2's replicate reduces with dist.all_reduce
        if group is dp_group:
            events.append(("dp", t.numel()))
        return real(t, *a, group=group, **k)

    monkeypatch.setattr(dist, "all_reduce", all_reduce)

    class TPNorms(TorchDispatchMode):
        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            if func.namespace == "_c10d_functional" and func.__name__.startswith("all_reduce") \
                    and args[-1] == tp_name and args[0].numel() == CFG.d_model:
                events.append(("tp_norm",))
            return func(*args, **(kwargs or {}))

    for i, block in enumerate(m for m in net.modules() if isinstance(m, Block)):
        def on_output(mod, inp, out, i=i):
            out.register_hook(lambda g: events.append(("bwd", i)))
        block.register_forward_hook(on_output)
    idx = torch.randint(0, CFG.vocab_size, (MICRO, 2, CFG.seq_len + 1))
    per_micro = []
    for k in range(MICRO):
        sync_off = strategy.block_backward_sync() if k < MICRO - 1 else contextlib.nullcontext()
        with sync_off, TPNorms(), warnings.catch_warnings():
            warnings.simplefilter("ignore")
            logits = net(idx[k, :, :-1])
            F.cross_entropy(logits.reshape(-1, CFG.vocab_size), idx[k, :, 1:].reshape(-1)).backward()
        per_micro.append(list(events))
        events.clear()
    return per_micro


def _planned(tp: int, sp: bool) -> dict[str, tuple[float, float]]:
    """Planner: collective name -> (calls, bytes) per step, tp at dp 2 and MICRO micro-batches."""
    model = ModelSpec.from_shape(CFG.n_layers, CFG.d_model, CFG.n_heads, CFG.vocab_size, CFG.seq_len,
                                 n_params=ModelSpec.trainer_gpt_params(CFG.n_layers, CFG.d_model,
                                                                       CFG.vocab_size, CFG.seq_len))
    st = get_strategy("tp", {"tensor_parallel_size": tp})
    lay = resolve_layout(st, model, 2 * tp, tp=tp, micro_batch=2, global_batch=2 * 2 * MICRO)
    assert (lay.dp, lay.micro_batches) == (2, MICRO)
    colls = collectives(model, as_applied(st, lay.dp), replace(lay, sequence_parallel=sp), "32", "cpu")
    return {c.name: (c.calls, c.bytes_per_call * c.calls) for c in colls}


@pytest.mark.parametrize("tp,sp", [(1, False), (2, False), (2, True)], ids=["tp1", "tp2", "tp2_sp"])
def test_tp_replicas_reduce_per_block_during_backward_once_per_accumulation(fake_world, monkeypatch, tp, sp):
    first, last = _run_accumulating(fake_world, monkeypatch, tp, sp)
    dp = lambda evs: [e[1] for e in evs if e[0] == "dp"]   # noqa: E731
    # no data-parallel sync while accumulating (the old root-only replicate all-reduced here too)
    assert dp(first) == [], first
    # the last micro-batch: one all-reduce per Block, then the root's: the hand count
    assert dp(last) == BY_HAND[tp], last
    # ... Block 1's as soon as its backward is done, before Block 0's backward starts (overlap)
    assert [e for e in last if e[0] != "tp_norm"][:3] == [("bwd", 1), ("dp", BY_HAND[tp][0]), ("bwd", 0)], last
    plan = _planned(tp, sp)
    calls, size = plan["dp_grad_all_reduce"]
    assert calls == len(BY_HAND[tp])
    # bytes: exact at tp 1; at tp 2 the planner splits the LayerNorms' and positions' share by tp
    # (model_states.local_params), 0.04 % short here
    assert size == pytest.approx(4 * sum(BY_HAND[tp]), rel=1e-3 if tp > 1 else 1e-12)
    if sp:
        # the sequence-parallel LayerNorms' TP all-reduce (FSDP2's, part of the replicas' sync):
        # also once a step: 2 x (2 L + 1) = 10, none while accumulating
        norms = [sum(e[0] == "tp_norm" for e in evs) for evs in (first, last)]
        assert norms == [0, 2 * (2 * CFG.n_layers + 1)]
        assert plan["tp_layernorm_grad_all_reduce"][0] == sum(norms)


# -- fused AdamW where the plan clips gradients itself ----------------------------------------------
def _optimizer_on_a_cuda_rank(plan):
    """LitModule.configure_optimizers as on a CUDA rank under bf16-mixed with gradient clipping (as
    tests/unit/test_fused_clip.py: the device says cuda, the tensors stay on this CPU)."""
    import lightning as L

    from scalelab.models.lit import LitModule

    nano = GPTConfig(n_layers=1, n_heads=2, d_model=16, seq_len=8, vocab_size=256)
    lit = LitModule(nano, "lm", functools.partial(torch.optim.AdamW), 1e-3, 10, 0, "constant", 0.1,
                    plan=plan, fused_on_gpu=True)
    lit._device = torch.device("cuda", 0)
    lit.trainer = L.Trainer(accelerator="cpu", devices=1, precision="bf16-mixed", gradient_clip_val=1.0,
                            logger=False, enable_checkpointing=False, enable_progress_bar=False,
                            enable_model_summary=False)
    return lit.configure_optimizers()["optimizer"]


@pytest.mark.parametrize("name", ["pipeline", "nd"])
def test_plans_that_clip_themselves_keep_the_fused_kernel(name):
    """pipeline and nd clip with clip_grads_with_norm_ under manual optimization: Lightning's
    MixedPrecision.clip_gradients, which refuses a fused optimizer, never runs for them."""
    from scalelab.strategies.nd import ND
    from scalelab.strategies.pipeline import Pipeline

    plan = Pipeline() if name == "pipeline" else ND()
    assert plan.clips_gradients_itself
    assert _optimizer_on_a_cuda_rank(plan).defaults.get("fused") is True


def test_plans_lightning_clips_for_stay_on_foreach():
    from scalelab.strategies.tensor_parallel import TensorParallel

    assert not TensorParallel().clips_gradients_itself
    assert not _optimizer_on_a_cuda_rank(TensorParallel()).defaults.get("fused")

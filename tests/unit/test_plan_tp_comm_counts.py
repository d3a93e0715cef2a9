"""The planner's tensor-parallel and pipeline-send bytes against the collectives scalelab's real TP
code issues (strategies/tensor_parallel.py), counted in one process on torch's fake process group:
every c10d functional collective that DTensor runs during one forward + backward is recorded with
its op, dtype and full buffer size S (an all-gather's output, a reduce-scatter's or all-reduce's
input), and compared, op by op and size by size, with plan.comm.tp_rank_collectives (the
planner's "S per call x calls"). Exact: the planner has no tolerance to hide behind here."""
from __future__ import annotations

import warnings
from collections import Counter
from dataclasses import replace

import pytest

torch = pytest.importorskip("torch")
dist = pytest.importorskip("torch.distributed")

from scalelab.models.gpt import GPT, GPTConfig  # noqa: E402
from scalelab.plan import ModelSpec, get_strategy, resolve_layout  # noqa: E402
from scalelab.plan.comm import collectives, tp_rank_collectives  # noqa: E402
from scalelab.plan.strategies import as_applied  # noqa: E402

OPS = {"all_reduce": "all_reduce", "all_gather_into_tensor": "all_gather", "reduce_scatter_tensor": "reduce_scatter"}
TP = 2


@pytest.fixture
def fake_world():
    """A fake process group of `world` ranks (this process is rank 0; collectives return at once)."""
    from torch.testing._internal.distributed.fake_pg import FakeStore

    if dist.is_initialized():
        pytest.skip("a process group is already initialised in this process")

    def init(world: int):
        if dist.is_initialized():
            dist.destroy_process_group()
        dist.init_process_group("fake", store=FakeStore(), rank=0, world_size=world)

    yield init
    if dist.is_initialized():
        dist.destroy_process_group()


def _spy(log: list, tp_group: str):
    from torch.utils._python_dispatch import TorchDispatchMode

    class Spy(TorchDispatchMode):
        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            name = func.__name__.split(".")[0]
            if func.namespace == "_c10d_functional" and name in OPS:
                t, group = args[0], args[-1]
                if group == tp_group:   # FSDP2 / replicate's own dp collectives are not TP's
                    size = t.numel() * t.element_size() * (TP if name == "all_gather_into_tensor" else 1)
                    log.append((OPS[name], str(t.dtype).removeprefix("torch."), size))
            return func(*args, **(kwargs or {}))

    return Spy()


def measure(init, cfg: GPTConfig, b: int, bf16: bool, sp: bool, dp: int = 1, wrap: str = "",
            stage: int | None = None, stages: int = 2) -> Counter:
    """(op, dtype, S bytes) -> calls in one forward + backward of the real TP model (or of pipeline
    stage `stage`), under CPU bf16 autocast (bf16-mixed) or fp32; wrap: "fsdp" (fsdp_tp: FSDP2
    with scalelab's MixedPrecisionPolicy over dp) or "replicate" (tp at dp > 1)."""
    import torch.nn.functional as F
    from torch.distributed.device_mesh import init_device_mesh

    from scalelab.strategies.fsdp import apply_fsdp
    from scalelab.strategies.pipeline_split import make_stage
    from scalelab.strategies.tensor_parallel import apply_replicate, apply_tensor_parallel

    init(TP * dp)
    torch.manual_seed(0)
    net = GPT(cfg)
    if stage is not None:
        make_stage(net, stage, stages)
    mesh = init_device_mesh("cpu", (dp, TP), mesh_dim_names=("dp", "tp"))
    apply_tensor_parallel(net, mesh["tp"], sp)
    precision = "bf16-mixed" if bf16 else "32-true"
    if wrap == "fsdp":
        apply_fsdp(net, mesh["dp"], precision)
    elif wrap == "replicate":   # as the tp strategy applies it: each Block, then the root
        apply_replicate(net, mesh["dp"], precision)
    s, V = cfg.seq_len, cfg.vocab_size
    idx = torch.randint(0, V, (b, s + 1))
    if net.tok_emb is not None:
        inp = idx[:, :-1]
    else:   # a later stage receives the residual stream (its sequence shard with sp), fp32
        inp = torch.randn(b, s // TP if sp else s, cfg.d_model, requires_grad=True)
    log: list = []
    with warnings.catch_warnings(), _spy(log, mesh["tp"].get_group().group_name):
        warnings.simplefilter("ignore")
        with torch.autocast("cpu", dtype=torch.bfloat16, enabled=bf16):
            out = net(inp)
            loss = (F.cross_entropy(out.float().reshape(-1, V), idx[:, 1:].reshape(-1))
                    if net.lm_head is not None else out.float().square().mean())
        loss.backward()
    return Counter(log)


def planned(cfg: GPTConfig, b: int, bf16: bool, sp: bool, strategy: str = "tp", dp: int = 1,
            stage: int = 0, stages: int = 1) -> Counter:
    """(op, S bytes) -> calls per step (one micro-batch) as the planner predicts for a CPU run."""
    model = ModelSpec.from_shape(cfg.n_layers, cfg.d_model, cfg.n_heads, cfg.vocab_size, cfg.seq_len)
    st = get_strategy(strategy, {"tp": TP, "pp": stages} if strategy == "nd" else {"tensor_parallel_size": TP})
    lay = resolve_layout(st, model, TP * dp * stages, tp=TP, pp=stages, micro_batch=b,
                         global_batch=b * dp * (stages if strategy == "nd" else 1))
    lay = replace(lay, sequence_parallel=sp, micro_batches=1)
    precision = "bf16-mixed" if bf16 else "32"
    got: Counter = Counter()
    for c in tp_rank_collectives(model, as_applied(st, lay.dp), lay, precision, "cpu", stage):
        got[(c.op, c.bytes_per_call)] += c.calls
    return got


def _no_dtype(c: Counter) -> Counter:
    out: Counter = Counter()
    for (op, _, size), n in c.items():
        out[(op, size)] += n
    return out


SHAPES = [GPTConfig(n_layers=2, n_heads=2, d_model=64, seq_len=16, vocab_size=256),
          GPTConfig(n_layers=3, n_heads=4, d_model=32, seq_len=8, vocab_size=128, mlp_ratio=2)]


@pytest.mark.parametrize("sp", [False, True], ids=["no_sp", "sp"])
@pytest.mark.parametrize("bf16", [False, True], ids=["fp32", "bf16"])
@pytest.mark.parametrize("shape", range(len(SHAPES)))
def test_tp_planner_matches_the_counted_collectives(fake_world, shape, bf16, sp):
    cfg = SHAPES[shape]
    b = 2 + shape
    assert _no_dtype(measure(fake_world, cfg, b, bf16, sp)) == planned(cfg, b, bf16, sp)


def test_tp_bf16_by_hand(fake_world):
    """The reviewer's case, L 2, h 64, s 16, b 2, V 256, tp 2, CPU bf16 autocast, no sp. bsh = 2048.
    Forward: 2 per layer row-parallel all-reduces in bf16 (4 x 4,096), the vocab-parallel embedding's
    in fp32 (8,192: the embedding table and the sum stay fp32), the logits all-gathered in bf16
    (S = b s V 2 = 16,384). Backward: q, k, v and up are 4 column-parallel Linears, each all-reducing
    its input gradient in fp32 (the LayerNorm output's dtype), + lm_head's: 9 x 8,192.
    Old planner: 4 L + 2 = 10 all-reduces of b s h 2 = 40,960 bytes sent; real: 106,496."""
    cfg = SHAPES[0]
    bsh = 2 * 16 * 64
    got = measure(fake_world, cfg, 2, bf16=True, sp=False)
    assert got == Counter({("all_reduce", "bfloat16", bsh * 2): 4, ("all_reduce", "float32", bsh * 4): 1 + 9,
                           ("all_gather", "bfloat16", 2 * 16 * 256 * 2): 1})
    model = ModelSpec.from_shape(2, 64, 2, 256, 16)
    st = get_strategy("tp", {"tensor_parallel_size": 2})
    lay = replace(resolve_layout(st, model, 2, tp=2, micro_batch=2, global_batch=2), sequence_parallel=False)
    tp = [c for c in collectives(model, st, lay, "bf16-mixed", "cpu") if c.group == "tp"]
    # bytes each rank sends: all-reduce S x 2(t-1)/t = S, all-gather S x (t-1)/t = S / 2
    sent = 4 * bsh * 2 + 8192 + 9 * bsh * 4 + 16_384 / 2
    assert sent == 106_496
    assert sum(c.bytes_per_step for c in tp) == sent
    assert sum(c.calls for c in tp) == 15


def test_tp_sp_bf16_dtypes(fake_world):
    """Sequence parallel under CPU bf16 autocast: the gathered LayerNorm outputs and their
    gradients' reduce-scatters are fp32, the row-parallel reduce-scatters and their gradients'
    all-gathers bf16 (L 2: 2 per layer each; + lm_head's input gather / gradient reduce-scatter)."""
    bsh = 2 * 16 * 64
    got = measure(fake_world, SHAPES[0], 2, bf16=True, sp=True)
    assert got == Counter({("all_reduce", "float32", bsh * 4): 1, ("all_gather", "float32", bsh * 4): 5 + 1,
                           ("reduce_scatter", "bfloat16", bsh * 2): 4, ("all_gather", "bfloat16", 2 * 16 * 256 * 2): 1,
                           ("reduce_scatter", "float32", bsh * 4): 5, ("all_gather", "bfloat16", bsh * 2): 4})


@pytest.mark.parametrize("sp", [False, True], ids=["no_sp", "sp"])
@pytest.mark.parametrize("wrap,strategy", [("fsdp", "fsdp_tp"), ("replicate", "tp")])
def test_tp_under_fsdp2_mixed_precision(fake_world, wrap, strategy, sp):
    """fsdp_tp (FSDP2) and tp at dp 2 (replicate), bf16-mixed: MixedPrecisionPolicy's bf16 weights
    and Block inputs make the residual stream bf16, so every TP collective is bf16 on CPU (CUDA
    autocast would keep layer_norm's outputs fp32: tp_element_bytes); with sp FSDP2 also
    all-reduces the LayerNorms' parameter gradients over tp."""
    cfg = SHAPES[0]
    got = measure(fake_world, cfg, 2, True, sp, dp=2, wrap=wrap)
    assert {dt for _, dt, _ in got} == {"bfloat16"}
    assert _no_dtype(got) == planned(cfg, 2, True, sp, strategy, dp=2)


@pytest.mark.parametrize("sp", [False, True], ids=["no_sp", "sp"])
@pytest.mark.parametrize("stage", [0, 1])
def test_tp_of_a_pipeline_stage(fake_world, stage, sp):
    """nd at pp 2, dp 1 (plain autocast): stage 0 has the embedding and 2 Blocks, stage 1 two Blocks
    and the head; the planner's rank `stage` counts the same."""
    cfg = GPTConfig(n_layers=4, n_heads=2, d_model=32, seq_len=8, vocab_size=64)
    got = measure(fake_world, cfg, 2, True, sp, stage=stage, stages=2)
    assert _no_dtype(got) == planned(cfg, 2, True, sp, "nd", stage=stage, stages=2)


def test_pipeline_send_is_the_fp32_residual_stream_under_autocast():
    """What a stage sends under CPU bf16 autocast is its last Block's output, the residual stream:
    fp32 (fp32 embeddings + residual adds); the gradient sent back is fp32 too. The planner's
    pipeline send: b s h x 4 bytes, not the 2 it used to assume."""
    from scalelab.strategies.pipeline_split import make_stage

    cfg = GPTConfig(n_layers=2, n_heads=2, d_model=32, seq_len=8, vocab_size=64)
    first = make_stage(GPT(cfg), 0, 2)
    idx = torch.randint(0, 64, (3, 8))
    with torch.autocast("cpu", dtype=torch.bfloat16):
        sent = first(idx)
        received = sent.detach().requires_grad_()
        last = make_stage(GPT(cfg), 1, 2)
        out = last(received)
    out.float().sum().backward()
    assert sent.dtype == torch.float32 and received.grad.dtype == torch.float32
    model = ModelSpec.from_shape(2, 32, 2, 64, 8)
    st = get_strategy("pipeline")
    lay = resolve_layout(st, model, 2, pp=2, micro_batch=3, global_batch=12)
    send = {c.name: c for c in collectives(model, st, lay, "bf16-mixed")}["pp_activation_send"]
    assert send.bytes_per_call == 3 * 8 * 32 * 4
    # 2 stages: stage 0 sends one activation forward, stage 1 one gradient back per micro-batch
    assert send.calls == lay.micro_batches == 4


def test_pipeline_send_under_fsdp2_mixed_precision_is_bf16(fake_world):
    """nd at dp > 1, bf16-mixed: FSDP2 casts each Block's input to bf16, so the stage's output (and
    the planner's send) is 16-bit; with sequence parallelism each TP rank sends its s / t shard."""
    from torch.distributed.device_mesh import init_device_mesh

    from scalelab.strategies.fsdp import apply_fsdp
    from scalelab.strategies.pipeline_split import make_stage

    fake_world(2)
    cfg = GPTConfig(n_layers=2, n_heads=2, d_model=32, seq_len=8, vocab_size=64)
    stage = apply_fsdp(make_stage(GPT(cfg), 0, 2), init_device_mesh("cpu", (2,)), "bf16-mixed")
    with warnings.catch_warnings(), torch.autocast("cpu", dtype=torch.bfloat16):
        warnings.simplefilter("ignore")
        assert stage(torch.randint(0, 64, (2, 8))).dtype == torch.bfloat16
    model = ModelSpec.from_shape(4, 32, 2, 64, 8)
    st = get_strategy("nd", {"pp": 2, "tp": 2})
    lay = resolve_layout(st, model, 8, tp=2, pp=2, micro_batch=2, global_batch=16)
    assert lay.dp == 2
    for sp, shard in ((False, 1), (True, 2)):
        colls = collectives(model, as_applied(st, lay.dp), replace(lay, sequence_parallel=sp), "bf16-mixed")
        send = {c.name: c for c in colls}["pp_activation_send"]
        assert send.bytes_per_call == 2 * 8 * 32 * 2 / shard

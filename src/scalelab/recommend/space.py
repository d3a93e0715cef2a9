"""The configuration space `scalelab recommend` searches, and what the planner says of each point.

A point is one job the trainer can run: a strategy and its parallel degrees (tp, pp; dp is the
rest), the device layout (devices per node x nodes), the batch split (micro-batch x accumulation,
or a pipeline's micro-batches) of a global batch, activation checkpointing and precision. Each is
built with the planner (plan.step_time.build_terms), pruned when it does not fit device memory
(plan.peak_memory.fits), and timed (plan.step_time.step_time). Nothing here starts a process.

Pruning rules that are the trainer's, not the planner's, are applied here too so that no candidate
is one `scalelab-train` would refuse: TP stays inside a node and must divide heads, width, MLP
width and vocabulary (strategies/tensor_parallel.check_tp_degree); a 1F1B pipeline needs at least
as many micro-batches as stages (strategies/pipeline); `single` at N > 1 devices trains N
independent replicas, so it is not a way to train the asked job.
"""
from __future__ import annotations

import shlex
from dataclasses import dataclass, field
from types import SimpleNamespace

from scalelab.plan.hardware import Hardware, trainer_name
from scalelab.plan.spec import STRATEGIES, ModelSpec, PlanError, get_strategy, padded_vocab, tp_indivisible
from scalelab.plan.peak_memory import device_total_bytes, fits_host
from scalelab.plan.step_time import Terms, build_terms, step_time
from scalelab.plan.strategies import trainer_refuses

# Strategies that compute the same gradients as single-device training (the default search).
EXACT = ("single", "ddp", "fsdp", "fsdp_grad_op", "zero1", "zero2", "zero3", "zero2_offload",
         "zero3_offload", "tp", "fsdp_tp", "pipeline", "nd")
# Lossy or asynchronous ones: searched only when named (--strategies) or with --strategies all.
APPROXIMATE = {"ddp_compress": "all-reduces bf16 gradients", "ddp_powersgd": "low-rank gradients",
               "local_sgd": "averages parameters every few steps instead of gradients"}
CHECKPOINTING = ("none", "selective", "full")


@dataclass
class Request:
    """What the user asked: the model, the devices, the batch(es), and which choices to search."""
    model: ModelSpec
    model_name: str | None            # a conf/model/ name, or None (shape flags: model.arch.* overrides)
    hardware: Hardware
    hardware_name: str
    devices: int
    nodes: int = 1
    global_batches: tuple[int, ...] = (16,)
    precisions: tuple[str, ...] = ("32",)
    optimizer: str = "adam"
    strategies: tuple[str, ...] = EXACT
    checkpointing: tuple[str, ...] = CHECKPOINTING
    smaller_worlds: bool = False      # also fewer devices (the cost objective)
    max_micro_batches: int = 64       # accumulation / pipeline micro-batches searched up to this
    headroom: float = 0.0             # keep this fraction of device memory free (allocator slack)
    params_asked: float | None = None  # --params as given (the model is the shape guessed for it, exact count)

    @property
    def is_cpu(self) -> bool:
        # the profile's kind, not its name: a cpu profile named `workstation` got offload searched
        return self.hardware.kind == "cpu"


@dataclass
class Candidate:
    strategy: str
    devices: int
    nodes: int
    tp: int
    pp: int
    dp: int
    micro_batch: int
    micro_batches: int                # accumulation steps, or a pipeline's micro-batches per step
    global_batch: int
    checkpointing: str
    precision: str
    terms: Terms = field(repr=False)
    times: dict = field(repr=False)
    memory_bytes: float = 0.0

    @property
    def world(self) -> int:
        return self.devices * self.nodes

    def key(self) -> tuple:
        return (self.strategy, self.devices, self.nodes, self.tp, self.pp, self.micro_batch,
                self.micro_batches, self.global_batch, self.checkpointing, self.precision)

    def label(self) -> str:
        split = f"{self.micro_batch}x{self.micro_batches}"
        return (f"{self.strategy} {self.world}={self.nodes}x{self.devices} dp{self.dp} tp{self.tp} pp{self.pp} "
                f"B{self.global_batch} micro {split} ckpt {self.checkpointing} {self.precision}")


def _divisors(n: int) -> list[int]:
    return [d for d in range(1, n + 1) if n % d == 0]


def device_layouts(req: Request) -> list[tuple[int, int]]:
    """(devices per node, nodes): the asked one, and with smaller_worlds every smaller one that
    keeps whole nodes (fewer nodes of `devices`; on one node, any divisor of `devices`)."""
    out = [(req.devices, n) for n in range(req.nodes, 0, -1)] if req.smaller_worlds else [(req.devices, req.nodes)]
    if req.smaller_worlds:
        out += [(d, 1) for d in reversed(_divisors(req.devices)) if d < req.devices]
    return out


def tp_degrees(model: ModelSpec, devices: int) -> list[int]:
    """TP degrees > 1 the trainer accepts: inside a node, dividing heads, width, MLP width, vocab."""
    if model.kind != "gpt":
        return []
    return [t for t in _divisors(devices) if t > 1 and not tp_indivisible(model, t)]


def no_degree_reason(strategy: str, model: ModelSpec, devices: int, nodes: int) -> str:
    """Why `degrees` is empty, naming the dimension that does not divide: "the model's shape"
    hid that GPT-2's vocabulary 50257 (prime to every tp > 1) is what rules tp out."""
    where = f"{nodes}x{devices} devices"
    st = get_strategy(strategy)
    if st.tensor_parallel and model.kind == "gpt" and not tp_degrees(model, devices):
        tps = [t for t in _divisors(devices) if t > 1]
        if not tps:
            return f"tensor parallelism needs 2 or more devices in a node ({where})"
        blocking: dict[tuple[str, int], list[int]] = {}
        for t in tps:
            for dim in tp_indivisible(model, t):
                blocking.setdefault(dim, []).append(t)
        said = "; ".join(f"{what} {v} is not divisible by tp {', '.join(map(str, ts))}"
                         for (what, v), ts in blocking.items())
        pad = padded_vocab(model.vocab, max(tps))   # the flag too: the hint named no way to ask for it (review)
        hint = (f" (a vocabulary padded to {pad} would split: --vocab {pad}, as Megatron and nanoGPT pad GPT-2's)"
                if any(what == "vocab_size" for what, _ in blocking) else "")
        return (f"no tp degree inside a node of {devices} divides the model (scalelab-train splits heads, width, "
                f"MLP width and vocabulary tp ways): {said}{hint}")
    if st.tensor_parallel and model.kind != "gpt":
        return "tensor parallelism splits the GPT models only"
    if st.pipeline and model.kind == "gpt" and model.n_layers < 2:
        return f"a pipeline needs 2 or more layers (the model has {model.n_layers})"
    world = devices * nodes
    if st.name == "fsdp_tp" and tp_degrees(model, devices) and all(world // t == 1 for t in tp_degrees(model, devices)):
        # at dp 1 it has nothing to shard over: the tp candidate of the same degree is that layout
        return (f"it shards over data-parallel replicas (dp = devices / tp > 1): every tp degree that "
                f"divides the model ({', '.join(map(str, tp_degrees(model, devices)))}) leaves dp 1 on {where}; "
                "tp runs that layout")
    return f"no tp/pp degree fits {where} and the model's shape"


def degrees(strategy: str, model: ModelSpec, devices: int, world: int) -> list[tuple[int, int]]:
    """(tp, pp) pairs for a strategy on `world` devices (`devices` per node)."""
    st = get_strategy(strategy)
    tps = tp_degrees(model, devices)
    pps = [p for p in _divisors(world) if 1 < p <= model.n_layers] if model.kind == "gpt" else []
    if st.tensor_parallel and st.pipeline:       # nd: any mix but the plain-FSDP corner
        return [(t, p) for t in [1, *tps] for p in [1, *pps]
                if (t > 1 or p > 1) and world % (t * p) == 0]
    if st.tensor_parallel:                        # tp: dp = the rest; fsdp_tp: needs dp > 1 to shard
        return [(t, 1) for t in tps if world % t == 0 and (st.name != "fsdp_tp" or world // t > 1)]
    if st.pipeline:
        return [(1, p) for p in pps]
    return [(1, 1)]


def batch_splits(strategy: str, per_replica: int, pp: int, limit: int) -> list[tuple[int, int]]:
    """(micro-batch, micro-batches) splitting one data-parallel replica's share of the batch.
    Pipelines cut it into m >= pp micro-batches (1F1B); the others accumulate m micro-batches."""
    splits = [(per_replica // m, m) for m in _divisors(per_replica) if m <= limit]
    if get_strategy(strategy).pipeline:
        splits = [(b, m) for b, m in splits if m >= pp]
    return splits


def strategy_list(names: str | None) -> tuple[str, ...]:
    """--strategies: a comma list, `all` (approximate ones too), or None (the exact ones)."""
    if not names:
        return EXACT
    wanted = list(STRATEGIES) if names.strip() == "all" else [n.strip() for n in names.split(",") if n.strip()]
    if not wanted:   # "," searched nothing and said no layout fits device memory
        raise PlanError(f"--strategies {names!r} names no strategy; valid: {', '.join(STRATEGIES)} (or all)")
    for n in wanted:
        if n not in STRATEGIES:
            raise PlanError(f"unknown strategy {n!r} in --strategies; valid: {', '.join(STRATEGIES)} (or all)")
    return tuple(wanted)


def skip_reason(strategy: str, req: Request, world: int) -> str | None:
    """Why a whole strategy is left out of this search (None: searched)."""
    st = get_strategy(strategy)
    if strategy == "single" and world > 1:
        return ("runs on 1 device (on more it trains independent replicas, no gradient sync): "
                "not the asked training")
    if req.is_cpu and (st.offload_optimizer or st.offload_params):
        return "offload moves states to host memory, which is the device's own memory on a CPU"
    if world == 1 and strategy != "single" and not (st.offload_optimizer or st.offload_params):
        return "on one device it shards and syncs nothing: single without the wrapper's overhead"
    refusals = [trainer_refuses(st, p, req.hardware.kind) for p in req.precisions]
    if all(refusals):   # at every precision asked (--precision bf16-true: DeepSpeed's ZeRO)
        return "the trainer refuses it: " + refusals[0].removeprefix(f"strategy={strategy}: ")
    return None


def unrunnable(req: Request) -> dict[str, str]:
    """{strategy: why} for the strategies of the request that have no layout on any of its device
    layouts (skipped, or no tp/pp degree), the reason said for the asked layout. Cheap: nothing is
    planned, so the command can refuse before its search."""
    out = {}
    for name in req.strategies:
        whys = []
        for devices, nodes in device_layouts(req):
            world = devices * nodes
            why = skip_reason(name, req, world)
            if why is None and not degrees(name, req.model, devices, world):
                why = no_degree_reason(name, req.model, devices, nodes)
            if why is None:
                break
            whys.append(why)
        else:
            out[name] = whys[0]
    return out


def check_runnable(req: Request) -> None:
    """PlanError when no strategy asked can run on the asked devices (`--strategies single
    --devices 2` ended in "0 of 1 layouts fit device memory", exit 1: memory was not the reason)."""
    why = unrunnable(req)
    if why and len(why) == len(req.strategies):
        where = f"{req.nodes}x{req.devices} devices" if req.nodes > 1 else f"{req.devices} device(s)"
        raise PlanError(f"--strategies {','.join(req.strategies)}: none can run on {where}: "
                        + "; ".join(f"{n}: {w}" for n, w in why.items())
                        + "; give other --strategies or --devices")


def _layouts(req: Request):
    """(strategy, world, tp, pp, dp) of every point the search builds, before the batch splits."""
    for devices, nodes in device_layouts(req):
        world = devices * nodes
        for name in req.strategies:
            if skip_reason(name, req, world) is None:
                for tp, pp in degrees(name, req.model, devices, world):
                    yield name, world, tp, pp, world // (tp * pp)


def _splits(req: Request, name: str, gb: int, pp: int, dp: int) -> list[tuple[int, int]]:
    return batch_splits(name, gb // dp, pp, req.max_micro_batches) if gb % dp == 0 else []


def check_batches(req: Request) -> None:
    """PlanError when no --global-batch splits over any layout searched (the default 16 on 4 x 8
    devices of a 7B GPT, vocab 50257: dp 32 everywhere tp cannot split, and a pipeline needs pp
    micro-batches a replica): the search ended in "no layout fits device memory", exit 1, while
    memory was not the reason. Names the smallest global batch some layout splits (dp, or dp x pp
    for a pipeline's 1F1B, at micro-batch 1)."""
    layouts = list(_layouts(req))
    if not layouts or any(_splits(req, n, gb, pp, dp) for n, _, _, pp, dp in layouts for gb in req.global_batches):
        return
    lowest = [dp * (pp if get_strategy(n).pipeline else 1) for n, _, _, pp, dp in layouts]   # micro-batch 1
    smallest = min((gb for gb, (n, _, _, pp, dp) in zip(lowest, layouts) if _splits(req, n, gb, pp, dp)), default=None)
    if smallest is None:   # a pipeline of more stages than the micro-batches searched: the search says so
        return
    plain = sorted({gb for gb, (n, *_) in zip(lowest, layouts) if not get_strategy(n).pipeline})
    piped = sorted({gb for gb, (n, *_) in zip(lowest, layouts) if get_strategy(n).pipeline})
    need = "; ".join(([f"dp {', '.join(map(str, plain))}"] if plain else [])
                     + ([f"a pipeline dp x pp {', '.join(map(str, piped))} (pp micro-batches a replica)"] if piped else []))
    where = f"{req.nodes}x{req.devices}" + (" or fewer" if req.smaller_worlds else "")
    raise PlanError(f"--global-batch {','.join(map(str, req.global_batches))} does not split over any layout searched "
                    f"on {where} devices (it needs a multiple of the data-parallel ranks: {need}); the smallest valid "
                    f"--global-batch is {smallest}")


# _build's reasons for a layout built and found too big (recommend counts "N of M fit" by them)
TOO_BIG, HOST_TOO_SMALL = "does not fit device memory", "offloaded states do not fit the node's host memory"
MEMORY_PRUNES = (TOO_BIG, HOST_TOO_SMALL)


def enumerate_candidates(req: Request, smallest: dict | None = None,
                         unsplit: dict | None = None) -> tuple[list[Candidate], dict]:
    """Every point of the space that fits device memory, and a tally of what was pruned and why.
    SMALLEST, where given, gets each strategy's least device memory of a layout built too big;
    UNSPLIT each strategy's (global batch, dp) pairs that did not divide (its layouts never built)."""
    pruned: dict[str, int] = {}

    def prune(why: str, n: int = 1) -> None:
        pruned[why] = pruned.get(why, 0) + n

    out: list[Candidate] = []
    for devices, nodes in device_layouts(req):
        world = devices * nodes
        for name in req.strategies:
            why = skip_reason(name, req, world)
            if why:
                prune(f"{name}: {why}")
                continue
            pairs = degrees(name, req.model, devices, world)
            if not pairs:
                prune(f"{name}: {no_degree_reason(name, req.model, devices, nodes)}")
            for tp, pp in pairs:
                dp = world // (tp * pp)
                for gb in req.global_batches:
                    if gb % dp:
                        prune(f"global batch not divisible by the {dp} data-parallel ranks")
                        if unsplit is not None:
                            unsplit.setdefault(name, set()).add((gb, dp))
                        continue
                    for micro, m in batch_splits(name, gb // dp, pp, req.max_micro_batches):
                        for ckpt in req.checkpointing:
                            for prec in req.precisions:
                                cand = _build(req, name, devices, nodes, tp, pp, micro, m, gb, ckpt, prec, prune,
                                              smallest)
                                if cand is not None:
                                    out.append(cand)
    return out, pruned


def _build(req: Request, name, devices, nodes, tp, pp, micro, m, gb, ckpt, prec, prune,
           smallest: dict | None = None) -> Candidate | None:
    refusal = trainer_refuses(get_strategy(name), prec, req.hardware.kind)   # fp16 under FSDP2, bf16-true with ZeRO
    if refusal:
        prune(f"precision {prec} refused by the trainer for this strategy")
        return None
    try:
        terms = build_terms(req.model, name, devices=devices, nodes=nodes, tp=tp, pp=pp, micro_batch=micro,
                            global_batch=gb, precision=prec, optimizer=req.optimizer,
                            activation_checkpointing=ckpt, device=req.hardware.kind)
    except PlanError as exc:
        prune(f"planner refused: {str(exc).split(';')[0]}")
        return None
    total = device_total_bytes(terms, req.hardware)
    if total > (1 - req.headroom) * req.hardware.memory_bytes:
        if smallest is not None:
            smallest[name] = min(total, smallest.get(name, total))
        prune(TOO_BIG + (f" less {req.headroom:.0%} headroom" if req.headroom else ""))
        return None
    if not fits_host(terms, req.hardware):
        prune(HOST_TOO_SMALL)
        return None
    L = terms.layout
    return Candidate(name, devices, nodes, L.tp, L.pp, L.dp, L.micro_batch, L.micro_batches, L.global_batch,
                     terms.checkpointing, terms.precision, terms, step_time(terms, req.hardware), total)


def train_overrides(c: Candidate, req: Request) -> list[str]:
    """The candidate in the trainer's vocabulary: the overrides of `scalelab plan`'s same-job line
    (strategy=, model, trainer.devices/num_nodes, data.global_batch_size and micro_batch_size,
    the strategy's degree options, precision, optimizer, checkpointing), one mapping for both."""
    from scalelab.plan.cli import train_command

    cmd = train_command(SimpleNamespace(model=req.model_name), c.terms, trainer_name(req.hardware))
    if cmd is None:
        raise PlanError("this model shape has no scalelab-train model (an MLP, or an MLP width that is not a "
                        "multiple of the hidden size); give --model NAME")
    return shlex.split(cmd)[1:]

"""Which gathered parameters DeepSpeed ZeRO-3 keeps from the forward to the backward.

ZeRO-3 does not release every layer's gathered parameters after its forward, as FSDP's
FULL_SHARD does. Once DeepSpeed has recorded a step's module trace (the first step), its
parameter coordinator (deepspeed/runtime/zero/partitioned_param_coordinator.py, 0.19.8) keeps a
gathered parameter after a module's forward when either
- its next use is fewer than `stage3_max_reuse_distance` elements of parameters ahead in the trace
  (default 1e9), counting each later module's own tensors; for a layer in the forward the next use
  is its backward, after every later layer's forward and backward. For a leaf module (the fetch
  unit `block`) DeepSpeed counts each later module's whole subtree instead, and the root's entry
  at the start of the backward holds every tensor: a Block stays when the layers after it hold
  fewer than R elements. Or
- the prefetcher has already looked past that next use: it walks the trace ahead of each module
  fetch and gathers up to `stage3_prefetch_bucket_size` elements (default 5e7) of parameters that
  are not gathered, skipping those that are, while fewer than `stage3_max_live_parameters` (1e9)
  are gathered; a parameter it skipped is not released before the use it was skipped for.
With the defaults a model of up to ~1e9 parameters stays gathered whole until its backward (full
tensors, in the parameters' dtype, beside the rank's partition), and the backward gathers nothing
again; a bigger one keeps 1.0e9 (fetch unit module) to 1.1e9-1.5e9 (block; 1.2B-70B GPTs). Measured
on real engines (tests/integration/test_plan_zero3_reuse.py, 2 gloo ranks): the elements gathered
or in flight at the end of a forward equal this simulation's for fetch units block and module,
reuse distances 0 to 1e9, prefetch sizes 0 to 5e7 and max live parameters down to 2e4.

At world size 1 nothing is gathered (the partition is the whole tensor), so this applies from 2,
or at any world size with offloaded parameters (their partitions are copied to the device).
Not modelled: full activation checkpointing adds recompute entries to the backward's trace; with
the fetch unit module that keeps 3-10 % less than counted here (the safe side), with block none.
The simulation replays the coordinator's rules over the model's module trace; it is torch-free.
"""
from __future__ import annotations

import bisect
from dataclasses import dataclass


NEVER = -10**10   # the step a tensor was last fetched for, before it ever was


@dataclass(frozen=True)
class Unit:
    """One module with forward hooks: the parameter tensors it fetches (element counts)."""
    name: str
    params: tuple[int, ...]            # its own tensors (recurse=False)
    children: tuple["Unit", ...] = ()
    leaf: bool = False                 # a DeepSpeed leaf module: fetches its whole subtree at once


def gpt_units(model, fetch_unit: str = "block", tp: int = 1) -> Unit:
    """The module tree ZeRO-3 hooks for a GPT shaped like `model` (plan.spec.ModelSpec): the
    structure of scalelab's GPT (embeddings, blocks of LayerNorm + q, k, v, out + LayerNorm + up,
    down, final LayerNorm, untied head when n_params has room for one). fetch_unit "block": each
    Block is one leaf (strategy.stage3_fetch_unit), fetching all its tensors at once."""
    h, f, V, s = model.hidden, model.ffn, model.vocab, model.seq_len
    if model.kind == "mlp":
        layers = tuple(Unit(f"layer{i}", (h * h // tp, h)) for i in range(model.n_layers))
        return Unit("model", (), layers)
    ln = Unit("ln", (h, h))
    attn = Unit("attn", (), tuple(Unit(n, (h * h // tp,)) for n in ("q", "k", "v", "out")))
    mlp = Unit("mlp", (), (Unit("up", (h * f // tp,)), Unit("down", (f * h // tp,))))
    parts = (ln, attn, ln, mlp)
    block = Unit("block", (), parts, leaf=fetch_unit == "block")
    head = (Unit("lm_head", (V * h // tp,)),) if len(model.weight_matrices()) > 4 else ()   # untied
    return Unit("model", (), (Unit("tok_emb", (V * h // tp,)), Unit("pos_emb", (s * h,)),
                              *(block,) * model.n_layers, Unit("ln_f", (h, h)), *head))


def kept_gathered_elements(root: Unit, persistence: int, reuse_distance: int, prefetch: int,
                           max_live: int = 10**9) -> int:
    """Elements of gathered (non-persistent) parameters alive at the end of the forward of a step
    after the first, by DeepSpeed 0.19.8's coordinator rules (module docstring)."""
    # Each tensor gets an id; a repeated Unit object (the block template) is a new module each
    # time it appears, so ids are keyed by the unit's path in the tree.
    numel: dict[int, int] = {}
    own: dict[tuple, tuple[int, ...]] = {}
    subtree: dict[tuple, tuple[int, ...]] = {}

    def assign(u: Unit, path: tuple) -> tuple[int, ...]:
        ids = []
        for n in u.params:
            ids.append(len(numel))
            numel[ids[-1]] = n
        own[path] = tuple(ids)
        for i, c in enumerate(u.children):
            ids += assign(c, path + (i,))
        subtree[path] = tuple(ids)
        return subtree[path]

    assign(root, ())

    def walk(u: Unit, path: tuple, backward: bool) -> list[tuple[tuple, bool]]:
        # hooks fire on modules with forward hooks: not inside a leaf. A module's pre-backward hook
        # fires when the gradient reaches its output: the container first, then its children in
        # reverse (the forward's pre-forward order is the container, then its children)
        if u.leaf:
            return [(path, True)]
        kids = list(enumerate(u.children))
        return [(path, False)] + [m for i, c in (reversed(kids) if backward else kids)
                                  for m in walk(c, path + (i,), backward)]

    modules = walk(root, (), False)
    n_forward = len(modules)
    modules += walk(root, (), True)
    # iter_params(module, recurse=leaf): what a module fetches, and what the reuse walk counts of
    # a later module when the module being released is (a leaf) or is not: DeepSpeed passes the
    # released module's leaf flag to every later module, so a leaf counts a later container
    # (the root's backward entry) with all of its tensors
    trace = [subtree[p] if leaf else own[p] for p, leaf in modules]
    persist = {p for p, n in numel.items() if n <= persistence}
    queue = [(p, step) for step, ids in enumerate(trace) for p in sorted(ids)]   # param trace
    qpos = 0
    # The reuse walk (below) as lookups: per view (a later module counted with all its tensors,
    # or its own), the running element count over the module order and where each tensor
    # occurs. Walking module by module was O(modules x window): 59 s for 8000 small layers, whose
    # 1e9-element window spans the whole model (found by a planner review).
    views = {}
    for as_leaf in (False, True):
        sizes, where = [0], {}
        for j, (path, _) in enumerate(modules):
            ids = subtree[path] if as_leaf else own[path]
            sizes.append(sizes[-1] + sum(numel[q] for q in ids))
            for q in ids:
                where.setdefault(q, []).append(j)
        views[as_leaf] = (sizes, where)
    fetched_for: dict[int, int] = {}    # the coordinator's defaultdict(lambda: int(-1e10))
    available: set[int] = set(persist)
    n_available = 0

    def gather(p: int) -> None:
        nonlocal n_available
        available.add(p)
        n_available += numel[p]

    for step in range(n_forward):
        ids = trace[step]
        for p in ids:
            if p not in available:
                gather(p)
        # pop this module's own tensors off the queue (they are fetched)
        need = {p for p in ids if fetched_for.get(p, NEVER) < step}
        popped: set[int] = set()
        while qpos < len(queue) and len(popped) < len(need):
            p, s = queue[qpos]
            qpos += 1
            fetched_for[p] = s
            popped.add(p)
        if prefetch > 0:
            budget, taken, chosen = min(max_live - n_available, prefetch), 0, set()
            while qpos < len(queue) and taken < budget:
                p, s = queue[qpos]
                qpos += 1
                fetched_for[p] = max(fetched_for.get(p, NEVER), s)
                if p not in available and p not in chosen:
                    chosen.add(p)
                    taken += numel[p]
            for p in chosen:
                gather(p)
        # released after its forward (the step id is now step + 1) unless the prefetcher looked
        # past a later use, or a later use is within reuse_distance elements. (A container is
        # released after its children, but it fetches no tensors of its own.)
        release = {p for p in ids if p not in persist and fetched_for.get(p, NEVER) <= step + 1}
        # DeepSpeed walks the later modules while it has counted fewer than reuse_distance
        # elements: module j is visited iff sizes[j] - sizes[step + 1] < reuse_distance; a tensor
        # found there is kept
        sizes, where = views[modules[step][1]]
        end = min(bisect.bisect_left(sizes, sizes[step + 1] + reuse_distance), len(modules))
        for p in list(release):
            at = where.get(p, ())
            k = bisect.bisect_right(at, step)
            if k < len(at) and at[k] < end:
                release.discard(p)
        for p in release:
            if p in available:
                available.discard(p)
                n_available -= numel[p]
    return sum(numel[p] for p in available if p not in persist)

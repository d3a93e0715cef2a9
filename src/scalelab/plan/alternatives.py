"""When a layout does not fit device memory: the nearest layouts that do.

"Nearest" = fewest changes to what the user asked for, then fastest predicted step. One change
at a time first: another strategy on the same devices, activation checkpointing, a smaller
micro-batch with more accumulation, more devices; then the pairs of them. Every suggestion keeps
the global batch (the job's optimisation: a layout at another batch trains something else): a
change that alters the data-parallel degree (tp's dp 1 where zero3 had 8, more devices) re-splits
that batch into micro-batch x accumulation for the new degree, the fastest split that fits.
"""
from __future__ import annotations

from itertools import combinations

from .hardware import Hardware
from .spec import STRATEGIES, PlanError
from .peak_memory import device_total_bytes, fits, tight
from .step_time import Terms, build_terms, step_time
from .strategies import trainer_refuses


# Strategies that train something else than the job asked for: independent replicas (single at
# N > 1 devices) and local SGD (no gradient sync every step) are never suggested as a fix.
_NOT_THE_SAME_TRAINING = ("single", "local_sgd")


def _changes(terms: Terms) -> list[tuple[str, dict]]:
    L, name = terms.layout, terms.strategy.name
    out: list[tuple[str, dict]] = []
    for s in STRATEGIES:
        if s not in (name, *_NOT_THE_SAME_TRAINING):
            out.append((f"strategy={s}", {"strategy": s}))
    for ckpt in ("selective", "full"):
        if ckpt != terms.checkpointing:
            out.append((f"activation checkpointing {ckpt}", {"activation_checkpointing": ckpt}))
    micro = L.micro_batch // 2
    while micro >= 1:
        if L.micro_batch % micro == 0:   # labelled once built: the accumulation follows the dp
            out.append(("micro-batch", {"micro_batch": micro}))
        micro //= 2
    for factor in (2, 4, 8):
        world = L.world * factor
        devices = min(world, L.devices_per_node)
        out.append((f"{world} devices ({world // devices} node(s) x {devices})",
                    {"devices": devices, "nodes": world // devices}))
    return out


# The changes that keep the strategy and the devices (plan --strategy all's footnote).
SAME_STRATEGY_AND_DEVICES = ("micro_batch", "activation_checkpointing")


def _splits(kw: dict, model, hw: Hardware) -> list[Terms]:
    """The candidate for `kw` at each micro-batch that splits its global batch over its dp (largest
    first; build_terms refuses a pipeline schedule the trainer refuses, 1F1B's m >= pp among them:
    splits.pipeline_schedule_refusal, for this path and _fitting's direct one alike)."""
    name = kw["strategy"]
    try:   # its dp, at the default micro-batches (4 pp: a schedule every rule accepts)
        probe = build_terms(model, name, **_args(kw, micro_batch=1, global_batch=None))
    except PlanError:
        return []
    per_replica = kw["global_batch"] // probe.layout.dp if kw["global_batch"] % probe.layout.dp == 0 else 0
    out = []
    for micro in sorted((d for d in range(1, per_replica + 1) if per_replica % d == 0), reverse=True):
        try:
            out.append(build_terms(model, name, **_args(kw, micro_batch=micro)))
        except PlanError:
            continue
    return out


def _args(kw: dict, **over) -> dict:
    return {k: v for k, v in {**kw, **over}.items() if k != "strategy"}


def nearest_fitting(terms: Terms, hw: Hardware, limit: int = 5, only: tuple[str, ...] | None = None) -> list[dict]:
    """Up to `limit` layouts near `terms` that fit, all at its global batch, as {"change", "step_s",
    "total_bytes", "micro_batch", "micro_batches", "dp", "global_batch", ...}; only: the layout keys
    a change may touch (None: any)."""
    L = terms.layout
    base = dict(strategy=terms.strategy, devices=L.devices_per_node, nodes=L.nodes, tp=L.tp, pp=L.pp,
                micro_batch=L.micro_batch, global_batch=L.global_batch, precision=terms.precision,
                optimizer=terms.optimizer, activation_checkpointing=terms.checkpointing,
                threads=terms.threads or None, sequence_parallel=L.sequence_parallel, device=hw.kind)
    singles = [c for c in _changes(terms) if only is None or set(c[1]) <= set(only)]
    found: list[dict] = []
    for n in (1, 2):
        for combo in combinations(singles, n):
            keys = [k for _, kw in combo for k in kw]
            if len(keys) != len(set(keys)):
                continue  # two changes of the same thing
            kw = dict(base)
            for _, change in combo:
                kw.update(change)
            if isinstance(kw["strategy"], str):   # a new strategy picks its own tp/pp defaults
                if trainer_refuses(STRATEGIES[kw["strategy"]], terms.precision, hw.kind):
                    continue   # zero3 at bf16-true, fsdp at fp16-mixed: no layout to run (review)
                kw.update(tp=None if STRATEGIES[kw["strategy"]].tensor_parallel else 1,
                          pp=None if STRATEGIES[kw["strategy"]].pipeline else 1)
            cand = _fitting(terms, kw, "micro_batch" in keys, hw)
            if cand is not None:
                CL = cand.layout
                what = "pipeline micro-batches" if CL.pp > 1 else "accumulation"
                label = " + ".join(f"micro-batch {CL.micro_batch} x {CL.micro_batches} {what}"
                                   if c == "micro-batch" else c for c, _ in combo)
                found.append({"change": label, "changes": n, "strategy": cand.strategy.name,
                              "world_size": CL.world, "dp": CL.dp, "tp": CL.tp, "pp": CL.pp,
                              "micro_batch": CL.micro_batch, "micro_batches": CL.micro_batches,
                              "global_batch": CL.global_batch,
                              "activation_checkpointing": cand.checkpointing,
                              "step_s": step_time(cand, hw)["step_s"],
                              "total_bytes": device_total_bytes(cand, hw)})
        if len(found) >= limit:
            break
    found.sort(key=lambda f: (f["changes"], f["step_s"]))
    top = found[:limit]
    # a fit of the job's own strategy on its own devices, when one fits: more devices are always
    # faster, and filled the list (fsdp_tp tp 8 on 16 GPUs: 128, 64, 32 devices, zero2, zero1, but not
    # fsdp_tp at micro-batch 4 there, 41 GiB); the fastest that is not tight, else the fastest
    own = lambda f: f["world_size"] <= L.world and f["strategy"] == terms.strategy.name  # noqa: E731
    if only is None and not any(own(f) for f in top):
        same = [f for f in found if own(f)] or nearest_fitting(terms, hw, limit, SAME_STRATEGY_AND_DEVICES)
        if same:
            pick = min(same, key=lambda f: (tight(f["total_bytes"], hw.memory_bytes), f["changes"], f["step_s"]))
            top = sorted(top[:limit - 1] + [pick], key=lambda f: (f["changes"], f["step_s"]))
    return top


def _fitting(terms: Terms, kw: dict, micro_changed: bool, hw: Hardware) -> Terms | None:
    """The candidate for `kw` at the job's global batch. Its micro-batch, when the change keeps the
    data-parallel degree or names the micro-batch itself; else (the degree differs: the old
    micro-batch would change the batch or not divide it) the fastest split that fits."""
    try:
        cand = build_terms(terms.model, kw["strategy"], **_args(kw))
    except PlanError:
        cand = None
    if micro_changed or (cand is not None and cand.layout.dp == terms.layout.dp):
        return cand if cand is not None and fits(cand, hw) else None
    fitting = [c for c in _splits(kw, terms.model, hw) if fits(c, hw)]
    return min(fitting, key=lambda c: step_time(c, hw)["step_s"]) if fitting else None

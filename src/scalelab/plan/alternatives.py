"""When a layout does not fit device memory: the nearest layouts that do.

"Nearest" = fewest changes to what the user asked for, then fastest predicted step. One change
at a time first: another strategy on the same devices, activation checkpointing, a smaller
micro-batch with more accumulation (same global batch), more devices (same micro-batch); then
the pairs of them.
"""
from __future__ import annotations

from itertools import combinations

from .hardware import Hardware
from .spec import STRATEGIES, PlanError
from .peak_memory import device_total_bytes, fits
from .step_time import Terms, build_terms, step_time


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
        if L.micro_batch % micro == 0:
            out.append((f"micro-batch {micro} x {L.micro_batches * L.micro_batch // micro} accumulation",
                        {"micro_batch": micro, "micro_batches": L.micro_batches * L.micro_batch // micro}))
        micro //= 2
    for factor in (2, 4, 8):
        world = L.world * factor
        devices = min(world, L.devices_per_node)
        out.append((f"{world} devices ({world // devices} node(s) x {devices})",
                    {"devices": devices, "nodes": world // devices}))
    return out


# The changes that keep the strategy and the devices (plan --strategy all's footnote).
SAME_STRATEGY_AND_DEVICES = ("micro_batch", "micro_batches", "activation_checkpointing")


def nearest_fitting(terms: Terms, hw: Hardware, limit: int = 5, only: tuple[str, ...] | None = None) -> list[dict]:
    """Up to `limit` layouts near `terms` that fit, as {"change", "step_s", "total_bytes", ...};
    only: the layout keys a change may touch (None: any)."""
    L = terms.layout
    base = dict(strategy=terms.strategy, devices=L.devices_per_node, nodes=L.nodes, tp=L.tp, pp=L.pp,
                micro_batch=L.micro_batch, micro_batches=L.micro_batches, precision=terms.precision,
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
                kw.update(tp=None if STRATEGIES[kw["strategy"]].tensor_parallel else 1,
                          pp=None if STRATEGIES[kw["strategy"]].pipeline else 1)
            try:
                cand = build_terms(terms.model, kw.pop("strategy"), **kw)
            except PlanError:
                continue
            if fits(cand, hw):
                found.append({"change": " + ".join(c for c, _ in combo), "changes": n,
                              "strategy": cand.strategy.name, "world_size": cand.layout.world,
                              "micro_batch": cand.layout.micro_batch,
                              "activation_checkpointing": cand.checkpointing,
                              "step_s": step_time(cand, hw)["step_s"],
                              "total_bytes": device_total_bytes(cand, hw)})
        if len(found) >= limit:
            break
    found.sort(key=lambda f: (f["changes"], f["step_s"]))
    return found[:limit]

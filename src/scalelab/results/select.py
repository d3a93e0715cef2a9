"""The selection `scalelab compare` applies before rendering: keys (dotted paths into run.json or W&B
metric names), --sort and --group-by. --where, which matches values as the table shows them, is
table.filter_records."""
from __future__ import annotations

import difflib
import json
import math
import re


def sort_key(r: dict):
    return (str(r.get("strategy")), r.get("global_batch_size") or 0, r.get("world_size") or 0,
            str(r.get("job", {}).get("name", "")))


MISSING = object()
# W&B metric names (results.run_logger.log_summary, the sweep summary) that are not a run.json path as written.
WANDB_KEYS = {
    "step_time/median_s": lambda r: _path(r, "step_time_s.median"),
    "step_time/p90_s": lambda r: _path(r, "step_time_s.p90"),
    "memory/peak_rss_bytes_max": lambda r: _max(_path(r, "memory.peak_rss_bytes_per_rank")),
    "memory/model_state_bytes_max": lambda r: _max(_path(r, "memory.model_state_bytes_per_rank")),
    "memory/peak_device_bytes_max": lambda r: _max(_path(r, "memory.peak_device_bytes_per_rank")),
    "lr/used": lambda r: _path(r, "lr"),
    "mfu": lambda r: _path(r, "mfu.value"),
    "job": lambda r: _path(r, "job.name"),
}


def _max(v):
    """The largest of a per-rank list, null ranks skipped (a null entry crashed max())."""
    ok = [x for x in v if isinstance(x, (int, float))] if isinstance(v, list) else []
    return max(ok) if ok else MISSING


def _path(rec, key: str):
    cur = rec
    for part in key.split("."):
        if isinstance(cur, dict) and part in cur:
            cur = cur[part]
        elif isinstance(cur, list) and part.lstrip("-").isdigit() and -len(cur) <= int(part) < len(cur):
            cur = cur[int(part)]
        else:
            return MISSING
    return cur


def lookup(rec: dict, key: str):
    """The value of KEY in a record (MISSING when it has none): a dotted path into run.json
    (`throughput.tokens_per_s`, `config.optim.name`, `memory.peak_rss_bytes_per_rank.0`) or a W&B
    metric name (`throughput/tokens_per_s`, `step_time/median_s`, `loss/final`)."""
    if key in WANDB_KEYS:
        return WANDB_KEYS[key](rec)
    per_rank = _RANK_KEY.fullmatch(key)   # run_logger.log_summary's breakdown/rankN/compute_s
    if per_rank:
        return _path(rec, f"breakdown.per_rank.{per_rank.group(1)}.{per_rank.group(2)}")
    return _path(rec, key.replace("/", "."))


_RANK_KEY = re.compile(r"breakdown/rank(\d+)/(\w+)")


class SelectError(ValueError):
    """A bad --where/--sort/--group-by key or expression (one line for the user)."""


# the table's column headers -> the key each shows (`--sort=-samples/s` was 'no run has this key')
HEADER_KEYS = {"world": "world_size", "batch": "global_batch_size", "samples/s": "throughput.samples_per_s",
               "tokens/s": "throughput.tokens_per_s", "step ms (med)": "step_time_s.median",
               "step ms (p90)": "step_time_s.p90", "loss first": "loss.first", "loss final": "loss.final",
               "MFU %": "mfu.value", "comm %": "breakdown.comm_fraction", "efficiency": "scaling_efficiency",
               "peak RSS MiB": "memory/peak_rss_bytes_max", "lr rule": "lr_rule", "lr warmup": "config.lr_scaling.warmup_steps", "nodes": "num_nodes",
               "device MiB/rank": "memory/peak_device_bytes_max", "state KiB/rank": "memory/model_state_bytes_max"}


def check_key(records: list[dict], key: str, option: str) -> None:
    if not key or all(lookup(r, key) is MISSING for r in records):
        header = HEADER_KEYS.get(key) or HEADER_KEYS.get(key.lstrip("-"))
        hint = (f"; the column {key.lstrip('-')} is the key {header}, in run.json's units (seconds, bytes, "
                "fractions)" if header else "")
        if not header:   # a misspelt key (`--sort throughput.tokens_per_sec`) named no valid one (review)
            have = sorted({k for r in records for k in flatten(r)} | set(WANDB_KEYS))
            close = difflib.get_close_matches(key.lstrip("-"), have, n=3, cutoff=0.75)
            hint = f"; did you mean {' or '.join(close)}?" if close else ""
        raise SelectError(f"{option} {key!r}: no run has this key{hint} (keys are dotted paths into run.json or W&B "
                          "metric names, e.g. strategy, world_size, throughput.tokens_per_s, config.optim.name)")


def finite(v) -> bool:
    """Whether V is a real number that orders (not NaN, not +-inf: a diverged run's loss)."""
    return isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v)


def _order(v):
    """Numbers first, then text; NaN and infinities after both: NaN compares false with everything,
    so sorted() left [3, nan, 1, 2, 0.5] as [3, nan, 0.5, 1, 2] (each side of it sorted alone)."""
    if isinstance(v, (int, float)) and not isinstance(v, bool):
        return (0, float(v), "") if math.isfinite(v) else (2, 0.0, _show(v))
    return (1, 0.0, _show(v))


def _absent(v) -> bool:
    """No value to sort by: missing, null, or a number that is not finite (they go last, either way)."""
    return v is MISSING or v is None or (isinstance(v, float) and not math.isfinite(v))


def sort_records(records: list[dict], key: str | None) -> list[dict]:
    """By KEY (`-KEY`: descending); runs without it (or with null, NaN or an infinity) last, in the
    default order; ties in the default order."""
    records = sorted(records, key=sort_key)
    if not key:
        return records
    desc, key = key.startswith("-"), key.lstrip("-")
    check_key(records, key, "--sort")
    have = [r for r in records if not _absent(lookup(r, key))]
    return (sorted(have, key=lambda r: _order(lookup(r, key)), reverse=desc)
            + [r for r in records if _absent(lookup(r, key))])


def group_records(records: list[dict], key: str) -> list[tuple]:
    """[(value, runs)] in the order of the values (NaN and infinities after the others, missing
    last); runs keep their order."""
    check_key(records, key, "--group-by")
    groups: dict[str, tuple] = {}
    for r in records:
        v = lookup(r, key)
        groups.setdefault(_show(v), (v, []))[1].append(r)
    return sorted(groups.values(), key=lambda g: (g[0] is MISSING, _order(g[0])))


def _show(v) -> str:
    if v is MISSING:
        return "(none)"
    return json.dumps(v, default=str) if isinstance(v, (list, dict)) else str(v)


def flatten(obj, prefix: str = "") -> dict:
    """{dotted.key: value} of a record's leaves (lists stay whole)."""
    out: dict = {}
    if isinstance(obj, dict) and obj:
        for k, v in obj.items():
            out.update(flatten(v, f"{prefix}{k}."))
        return out
    out[prefix[:-1]] = obj
    return out

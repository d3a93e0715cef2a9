"""What the dashboard's charts (results/charts.py) share: the chart dict, run and sweep names, and
how runs are split into series (what they may differ in and still pool)."""
from __future__ import annotations

import math
import statistics
from collections import defaultdict
from pathlib import Path

from scalelab.results.record import num_nodes
from scalelab.results.sweep import MEASURED_LOGGER, NOT_MEASURED, per_rank_batch, sweep_of_record
from scalelab.results.table import _show, flatten, lookup

MIB = 2**20


def chart(id_: str, title: str, x_title: str, y_title: str, traces: list[dict], kind: str = "line",
          barmode: str | None = None, notes: list[str] | None = None) -> dict:
    return {"id": id_, "title": title, "x_title": x_title, "y_title": y_title, "kind": kind, "barmode": barmode,
            "traces": traces, "notes": notes or []}


def job_name(rec: dict, labels: dict | None = None) -> str:
    """The run's job name; where LABELS (table.job_labels) has a longer one (a name runs of two
    sweeps share, "A/sw/0" and "B/sw/0"), that one, as the table shows it."""
    if labels and id(rec) in labels:
        return labels[id(rec)]
    return str((rec.get("job") or {}).get("name") or (rec.get("job") or {}).get("record_path") or "?")


def completed(records: list[dict]) -> list[dict]:
    return [r for r in records if r.get("status") == "completed"]


def sweep_of(rec: dict) -> str | None:
    """The folder of the run's sweep as it was read: where its record was found (sweep_of_record: a
    sweep moved or copied aside is its own, so `compare a_old a` after a rerun into `a` draws two
    throughput lines, not their median), else job.sweep_dir as train.py wrote it (None: a single run)."""
    where = sweep_of_record(rec)
    return str(where) if where is not None else _recorded_sweep(rec)


def _recorded_sweep(rec: dict) -> str | None:
    return (rec.get("job") or {}).get("sweep_dir") or None


def _norm(path) -> str | None:
    return str(Path(path).resolve()) if path else None


def sweep_labels(dirs, names: dict | None = None) -> dict:
    """Short series labels of the sweeps runs came from, keyed by _norm(dir): the dir's name (more
    path parts while names clash: series are keyed by label), or NAMES[dir]. Empty for fewer than two sweeps: series of one
    sweep need no label, and runs of two sweeps must never share a series (a before/after
    comparison would be averaged away). Callers label from one source each (records or summaries):
    a copied sweep's run.json still names the dir it ran in."""
    dirs = sorted({_norm(d) for d in dirs}, key=str)
    if len(dirs) < 2:
        return {}
    names = {_norm(k): v for k, v in (names or {}).items()}
    for parts in range(1, max(len(Path(d).parts) for d in dirs if d) + 1 if any(dirs) else 2):
        label = {d: names.get(d) or ("/".join(Path(d).parts[-parts:]) if d else "no sweep") for d in dirs}
        if len(set(label.values())) == len(dirs):   # as many path parts as it takes to tell them apart
            return label
    return {d: names.get(d) or d or "no sweep" for d in dirs}


def _suffix(rec: dict, group_by: str | None, sweep_shown: bool = False) -> str:
    """" [KEY=VALUE]" of --group-by; the run's sweep dir (`--group-by job.sweep_dir`) as its name,
    and nothing where the series already names its sweep (legends of full paths squeezed the plot)."""
    if not group_by:
        return ""
    value = lookup(rec, group_by)
    if isinstance(value, str) and value == _recorded_sweep(rec):
        return "" if sweep_shown else f" [{group_by}={Path(value).name}]"
    return f" [{group_by}={_show(value)}]"


# Config keys in which the runs one series pools may differ: what the series' own key and x axis
# hold, and what does not change the figure (a repeat's seed, where its files and logs go). Not
# launcher.name or extra_args (sweep.NOT_MEASURED: srun's --cpu-bind changes the speed; a series
# pooled launcher=local's and torchrun_local's runs as repeats).
_POOLED = (*NOT_MEASURED, "seed", "trainer.devices", "trainer.num_nodes", "data.global_batch_size",
           "lr_scaling.base_batch_size")


def _apart(runs: list[dict], key, pooled: tuple = ()) -> dict[int, str]:
    """{id(run): " k=v ..."}: within each series (runs of one `key(run)`), the config keys in which
    its runs differ besides those pooled (a throughput series pooled gpt_nano's 90k tokens/s with
    gpt_small's 5k as if repeats); that part of the run's config splits the series and names it.
    A group whose `.name` differs is named by it alone (model=gpt_small, not its every size)."""
    out: dict[int, str] = {}
    by_key: dict = defaultdict(list)
    for r in runs:
        by_key[key(r)].append(r)
    for members in by_key.values():
        # which logger splits a series of speeds (its per-step work is timed), not one of losses
        # (a chart's own `pooled`: logger.)
        flat = [{k: v for k, v in flatten(r.get("config") or {}).items()
                 if not k.startswith(_POOLED + pooled) or (k in MEASURED_LOGGER and not k.startswith(pooled))}
                for r in members]
        keys = sorted({k for f in flat for k in f})
        vary = [k for k in keys if len({repr(f.get(k)) for f in flat}) > 1]
        named = {k.split(".")[0] for k in vary if k.endswith(".name") and k.count(".") == 1}
        shown = [k for k in vary if k.split(".")[0] not in named or k.count(".") == 1 and k.endswith(".name")]
        for r, f in zip(members, flat):
            out[id(r)] = "".join(f" {k[:-5] if k.endswith('.name') else k}={_show(f.get(k))}" for k in shown)
    return out


def _median(xs: list[float]) -> float:
    return float(statistics.median(xs))


def by_reason(pairs: list[tuple[str, str]], prefix: str = "") -> list[str]:
    """[(job, why)] as one note per reason: "PREFIXwhy: job, job, ..." (first-seen order)."""
    out: dict[str, list[str]] = {}
    for job, why in pairs:
        out.setdefault(why, []).append(job)
    return [f"{prefix}{why}: {', '.join(jobs)}" for why, jobs in out.items()]


def _unique(names: list[str], extra: list[list[str]]) -> list[str]:
    """Make series names unique by appending, in turn, each disambiguator that tells them apart."""
    for more in extra:
        dup = {n for n in names if names.count(n) > 1}
        if not dup:
            break
        names = [f"{n} {e}" if n in dup else n for n, e in zip(names, more)]
    return names


def nodes_label(n: int) -> str:
    return f" {n} node" + ("s" if n > 1 else "")


def node_split(runs: list[dict], key, world=lambda r: r.get("world_size")) -> dict[int, str]:
    """{id(run): " N nodes" or ""}: within each series (runs of one `key(run)`) where one world
    size was run on different node counts (1 node x 2 devices and 2 nodes x 1 device), each node
    count is a series of its own: a median over both layouts is neither's figure. A series whose
    world sizes each have one layout stays one line (a 1, 2, 4-node sweep of 8 devices a node)."""
    by_key: dict = defaultdict(list)
    for r in runs:
        by_key[key(r)].append(r)
    out: dict[int, str] = {}
    for members in by_key.values():
        layouts: dict = defaultdict(set)
        for r in members:
            layouts[world(r)].add(num_nodes(r))
        split = any(len(n) > 1 for n in layouts.values())
        out.update({id(r): nodes_label(num_nodes(r)) if split else "" for r in members})
    return out


def finite_median(xs: list) -> float | None:
    """The median of the finite values (a diverged run's NaN or inf loss is no point on a median:
    statistics.median of [nan, 1, 2] depends on where the NaN sits); None where none is finite."""
    ok = [float(x) for x in xs if isinstance(x, (int, float)) and math.isfinite(x)]
    return _median(ok) if ok else None


def _throughput_series(runs: list[dict], sweeps: dict):
    """A run's throughput series: (sweep label, strategy, (0, global batch)); where that series is
    one world size alone and the runs of its per-rank batch span several (a weak-scaling sweep:
    16 a rank at 1, 2, 4 devices is batch 16, 32, 64: one point a line), (1, per-rank batch)."""
    def strong(r):
        return sweeps.get(_norm(sweep_of(r)), ""), str(r.get("strategy")), (0, r.get("global_batch_size") or 0)

    def weak(r):
        return strong(r)[:2] + ((1, per_rank_batch(r)),)

    worlds: dict = defaultdict(set)
    for r in runs:
        worlds[strong(r)].add(r.get("world_size"))
    lone = [r for r in runs if len(worlds[strong(r)]) == 1]
    for r in lone:
        worlds[weak(r)].add(r.get("world_size"))
    moved = {id(r) for r in lone if len(worlds[weak(r)]) > 1}
    return lambda r: weak(r) if id(r) in moved else strong(r)


def _batch_label(b: tuple) -> str:
    return f"b{b[1]}" if b[0] == 0 else f"{b[1]}/rank"

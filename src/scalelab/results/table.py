"""Comparison tables of run records: plain text (rich on a terminal: results/table_fit.py), markdown, JSON,
CSV, and the HTML dashboard (results/report.py); plus the selection `scalelab compare` applies first:
--where / --sort / --group-by on keys that are dotted paths into run.json or W&B metric names."""
from __future__ import annotations

import csv
import io
import json

from scalelab.results.record import dumps, num_nodes
# The selection lives in results/select.py; its names stay importable from here (cli, report, charts).
from scalelab.results.select import (MISSING, WANDB_KEYS, SelectError, _order, _show, check_key, flatten,  # noqa: F401
                                     group_records, lookup, sort_key, sort_records)

COLUMNS = [  # (header, getter, format)
    ("job", lambda r: r.get("job", {}).get("name", ""), "{}"),
    ("model", lambda r: (r.get("model") or {}).get("name"), "{}"),          # shown where runs differ in it
    ("precision", lambda r: _PRECISION.get(str(r.get("precision")), r.get("precision")), "{}"),  # (VARYING_ONLY)
    ("strategy", lambda r: r.get("strategy"), "{}"),
    ("world", lambda r: r.get("world_size"), "{}"),
    ("nodes", lambda r: num_nodes(r), "{}"),                               # (MULTI_NODE_ONLY)
    ("batch", lambda r: r.get("global_batch_size"), "{}"),
    ("micro x acc", lambda r: _micro_split(r), "{}"),
    ("lr rule", lambda r: r.get("lr_rule"), "{}"),                          # (VARYING_ONLY)
    ("lr", lambda r: r.get("lr"), "{:.3g}"),
    # the LR warm-up (steps, or a fraction of them): lr_search sweeps it with the LR (VARYING_ONLY)
    ("lr warmup", lambda r: ((r.get("config") or {}).get("lr_scaling") or {}).get("warmup_steps"), "{:g}"),
    ("samples/s", lambda r: _num(_sub(r, "throughput").get("samples_per_s")), "{:.1f}"),
    ("tokens/s", lambda r: _num(_sub(r, "throughput").get("tokens_per_s")), "{:.0f}"),
    ("step ms (med)", lambda r: _ms(_num(_sub(r, "step_time_s").get("median"))), "{:.1f}"),  # "*": short_run
    ("step ms (p90)", lambda r: _ms(_num(_sub(r, "step_time_s").get("p90"))), "{:.1f}"),
    # the device's own peak (max allocated, max over ranks): absent on CPU, where the column is dropped
    ("device MiB/rank", lambda r: _mib(_peak(r, "peak_device_bytes_per_rank")), "{:.0f}"),
    ("peak RSS MiB", lambda r: _mib(_peak(r, "peak_rss_bytes_per_rank")), "{:.0f}"),
    ("state KiB/rank", lambda r: _kib(_peak(r, "model_state_bytes_per_rank")), "{:.0f}"),
    ("loss first", lambda r: _loss(r, "first"), "{:.4f}"),
    ("loss final", lambda r: _loss(r, "final"), "{:.4f}"),
    ("MFU %", lambda r: _pct(_sub(r, "mfu").get("value")), "{:.1f}"),
    ("comm %", lambda r: _pct(_sub(r, "breakdown").get("comm_fraction")), "{:.0f}"),
    ("efficiency", lambda r: r.get("scaling_efficiency"), "{:.2f}"),     # " (vs N)": baseline world N > 1
    ("status", lambda r: r.get("status") if r.get("status") == "completed" else f"{r.get('status')}: {_clip(one_line(r.get('error', '')))}", "{}"),
]


def one_line(text) -> str:
    """TEXT as one line: its non-blank lines stripped and joined with " | " (a failed run's traceback
    tail or multi-line message; its newlines broke the text and markdown rows), tabs as spaces.
    run.json keeps the whole text."""
    text = str(text)
    if text.splitlines() != [text]:   # "\n", "\r", "\r\n" and the other line breaks str.splitlines knows
        text = " | ".join(ln.strip() for ln in text.splitlines() if ln.strip())
    return text.replace("\t", " ")


def _clip(text: str, width: int = 60) -> str:
    """TEXT cut to WIDTH at a word's end, "..." where cut (an error in the status cell was cut
    mid-word: "...stopped by SIGTERM: checkp"; the whole error is printed under the table)."""
    if len(text) <= width:
        return text
    cut = text[:width - 3]
    if text[width - 3] != " " and " " in cut:   # in a word: back to the word before it
        cut = cut.rsplit(" ", 1)[0]
    return cut.rstrip(" ,;:|") + "..."


def _micro_split(r: dict) -> str:
    """micro-batch x accumulation; a pipeline's per-replica batch is cut into its schedule's
    micro-batches (16 in 4 of 4: "4x4 pp"), which the plain 16x1 hid."""
    micro, acc = r.get("per_device_batch_size"), r.get("accumulate_grad_batches")
    chunks = (r.get("pipeline") or {}).get("microbatches")
    if isinstance(micro, int) and isinstance(acc, int) and isinstance(chunks, int) and chunks > 1 and micro % chunks == 0:
        return f"{micro // chunks}x{acc * chunks} pp"
    return f"{micro}x{acc}" if micro is not None and acc is not None else None   # a job without a record


def _sub(r: dict, key: str) -> dict:
    """R[KEY] where it is an object, else {} (a null `mfu`, `breakdown` or `memory`)."""
    v = r.get(key)
    return v if isinstance(v, dict) else {}


def _num(v):
    """V where it is a number, else None (a null field shows "-"; a non-finite float stays: "nan")."""
    return v if isinstance(v, (int, float)) and not isinstance(v, bool) else None


def _pct(v):
    return None if _num(v) is None else 100 * v


def _peak(r: dict, key: str):
    """The largest per-rank memory figure (null ranks skipped); None where none, or 0, is recorded
    (a null entry of a GPU run's peak_device_bytes_per_rank crashed max() before)."""
    return max((v for v in _sub(r, "memory").get(key) or [] if _num(v) is not None), default=0) or None


def _loss(r: dict, which: str):
    """loss.first / loss.final; NaN where the record has a loss curve but this loss is null: a
    diverged run, whose NaN run.json now writes as null (record.finite), still reads "nan"."""
    loss = _sub(r, "loss")
    v = _num(loss.get(which))
    return float("nan") if v is None and loss.get(which) is None and loss.get("curve") else v


def _ms(s):
    return None if s is None else s * 1e3


def _mib(b):
    return None if b is None else b / 2**20


def _kib(b):
    return None if b is None else b / 2**10


SHORT_MARK = "*"
OVERSUB_MARK = "!"   # on the world cell of a run whose ranks x threads exceeded its node's cores
# the cells a few steps' figure is in: sorted by tokens/s or MFU, a 3-step figure ranked unmarked (review)
SHORT_HEADS = ("samples/s", "tokens/s", "step ms (med)", "step ms (p90)", "MFU %")
SHORT_NOTE = f"{SHORT_MARK} fewer than 5 measured steps: not steady-state figures (raise trainer.max_steps)"
SHORT_BASE_NOTE = ("efficiency (vs ... short run): every run at its group's smallest world size was a short run, so "
                   "the efficiencies are against a figure that is not steady-state")


def vs_baseline(world: int, short: bool | None) -> str:
    """What an efficiency is measured against where that is not a steady 1-device run: " (vs 2)" (no
    1-device run completed in the group), " (vs short run)", " (vs 2, short run)"."""
    said = ([f"{world}"] if world > 1 else []) + (["short run"] if short else [])
    return f" (vs {', '.join(said)})" if said else ""


def oversubscribed(r: dict) -> tuple[int, int, int] | None:
    """(ranks per node, threads per rank, the node's cores) of a CPU run whose ranks x threads
    exceeded the cores the launcher counted (hardware.host_cores, as launch.oversubscribed warns):
    its ranks shared cores. None otherwise, and where the record lacks one of these."""
    hw = _sub(r, "hardware")
    ranks, threads, cores = (_num(v) for v in (r.get("devices_per_node") or r.get("world_size"),
                                               hw.get("threads_per_rank"), hw.get("host_cores")))
    if hw.get("accelerator") != "cpu" or not (ranks and threads and cores) or ranks * threads <= cores:
        return None
    return int(ranks), int(threads), int(cores)


def _row_name(r: dict, labels: dict[int, str] | None) -> str:
    """The name a footnote gives a row: its longer label (job_labels), its job name, its strategy."""
    return (labels or {}).get(id(r)) or (r.get("job") or {}).get("name") or r.get("strategy")


def oversub_note(records: list[dict], labels: dict[int, str] | None = None) -> list[str]:
    """The OVERSUB_MARK's footnote: which runs shared cores, and why their figures do not compare."""
    crowded = [(r, o) for r in records if (o := oversubscribed(r))]
    if not crowded:
        return []
    said = [f"{_row_name(r, labels)} "
            f"({ranks} ranks x {threads} thread(s) on {cores} cores)" for r, (ranks, threads, cores) in crowded]
    return [f"{OVERSUB_MARK} oversubscribed: {'; '.join(said[:8])}{'; ...' if len(said) > 8 else ''}: the ranks "
            "shared cores, so their step time, throughput, scaling efficiency and MFU measure that contention, "
            "not the strategy, and do not compare with runs that fit the host"]


def no_baseline_note(records: list[dict], labels: dict[int, str] | None = None) -> list[str]:
    """Where the efficiency column is shown, the completed runs with a throughput and "-" in it: no
    completed run of their config at another world size (that run failed, or was not swept); the
    cell said no why (review)."""
    if not any(r.get("scaling_efficiency") is not None for r in records):
        return []
    alone = [_row_name(r, labels) for r in records
             if r.get("status") == "completed" and r.get("scaling_efficiency") is None
             and _num(_sub(r, "throughput").get("samples_per_s")) is not None]
    if not alone:
        return []
    return [f"efficiency - ({', '.join(map(str, alone[:8]))}{', ...' if len(alone) > 8 else ''}): no completed run of "
            "the same config at another world size to measure against (it failed or was not swept)"]


def notes(records: list[dict], labels: dict[int, str] | None = None) -> list[str]:
    """The footnotes the table's marks need (LABELS: job_labels, the names the rows show)."""
    return (([SHORT_NOTE] if any(r.get("short_run") for r in records) else [])
            + ([SHORT_BASE_NOTE] if any(r.get("scaling_baseline_short") for r in records) else [])
            + no_baseline_note(records, labels) + oversub_note(records, labels))


def job_labels(records: list[dict]) -> dict[int, str]:
    """{id(record): a longer job name} for runs whose job name another run of a different folder
    has too (two sweeps in folders named `sw` both have "sw/0": their rows read the same): the name
    with as many folders above it as tell them apart ("A/sw/0", "B/sw/0"); a name its folder does
    not end with gets the folder in brackets ("sw/0 [copy/0]")."""
    from pathlib import Path

    by_name: dict[str, list[dict]] = {}
    for r in records:
        if (r.get("job") or {}).get("record_path"):
            by_name.setdefault(str(r["job"].get("name", "")), []).append(r)
    out: dict[int, str] = {}
    for name, runs in by_name.items():
        folders = [Path(r["job"]["record_path"]).resolve().parent for r in runs]
        if len(set(folders)) < 2:
            continue
        tail = tuple(p for p in name.split("/") if p)
        n = len(tail)
        for k in range(max(len(f.parts) for f in folders) + 1):   # k folders above the name's own
            labels = []
            for f in folders:
                if tail and f.parts[-n:] == tail:
                    labels.append("/".join(f.parts[len(f.parts) - n - k:]).replace("//", "/"))
                else:   # a renamed copy (sweepA copied to sweepB): its own folders, as many as the name has
                    labels.append(f"{name} [{'/'.join(f.parts[-(max(n, 1) + k):])}]")
            if len(set(labels)) == len(set(folders)):
                break
        out.update({id(r): lab for r, lab in zip(runs, labels)})
    return out


def _cells(rec: dict, columns, label: str | None = None) -> list[str]:
    out = []
    for head, get, fmt in columns:
        v = get(rec)
        if head == "job" and label:
            v = label   # a job name other runs have too, made longer (job_labels)
        cell = "-" if v is None or v == "" else one_line(fmt.format(v))   # a cell is one line
        if head == "world" and cell != "-" and oversubscribed(rec):
            cell += OVERSUB_MARK
        if head in SHORT_HEADS and rec.get("short_run") and cell != "-":
            cell += SHORT_MARK
        if (head == "efficiency" and cell != "-" and rec.get("short_run") and not (
                rec.get("scaling_baseline_short") and rec.get("world_size") == rec.get("scaling_baseline_world"))):
            cell += SHORT_MARK   # its own throughput is a few steps' (a short baseline's says "vs short run")
        if head == "efficiency" and cell != "-" and rec.get("scaling_kind") == "weak":
            cell += " weak"    # same per-rank batch (a run in both kinds of group shows its strong one)
        if head == "efficiency" and cell != "-":
            cell += vs_baseline(rec.get("scaling_baseline_world") or 1, rec.get("scaling_baseline_short"))
        out.append(cell)
    return out


# Shown only where the runs differ in them: a sweep over one model at one precision reads as
# before, while runs of two models side by side are told apart (their rows were identical but
# for a 20x throughput gap).
VARYING_ONLY = ("model", "precision", "lr rule", "lr warmup")
# Shown only where some run spans nodes: 1 node x 2 devices and 2 nodes x 1 device are both world 2
# (a scaling group holds both; its baseline is the 1-node one), and their rows read the same without it.
MULTI_NODE_ONLY = ("nodes",)
IDENTITY = ("job", "model", "precision", "lr rule", "strategy")   # what a row is: left-aligned, never wrapped
# one spelling per precision (the trainer takes Lightning's aliases)
_PRECISION = {"32": "32-true", "16": "16-mixed", "bf16": "bf16-mixed", "64": "64-true"}


def _columns(records: list[dict]):
    # Drop columns that are empty for every run (e.g. efficiency outside a sweep), and the
    # VARYING_ONLY ones where every run has the same value.
    out = []
    for c in COLUMNS:
        values = {str(v) for v in map(c[1], records) if v not in (None, "", [])}
        if c[0] in MULTI_NODE_ONLY and not any((c[1](r) or 1) > 1 for r in records):
            continue
        if values and (c[0] not in VARYING_ONLY or len(values) > 1):
            out.append(c)
    return out


def render(records: list[dict], fmt: str = "table", group_by: str | None = None, sort: str | None = None,
           summaries: list[dict] | None = None) -> str:
    """Records in FMT. `sort` (a key, `-KEY` descending) replaces the default order; `group_by`
    splits the table into one section per value; `summaries` (sweep.aggregate of each sweep dir)
    feed the dashboard's efficiency charts."""
    records = sort_records(records, sort)
    if group_by:
        records = [r for _, members in group_records(records, group_by) for r in members]
    if fmt == "json":
        if group_by:
            # runs without the key: null (a Python object's repr, different each run, was the value)
            return dumps({"group_by": group_by, "groups": [{"value": None if v is MISSING else v, "runs": m}
                                                           for v, m in group_records(records, group_by)]}, indent=2)
        return dumps(records, indent=2)   # strict JSON: a diverged run's NaN loss is null
    if fmt == "csv":
        return _csv(records)
    if fmt == "html":
        from scalelab.results.report import render_html

        return render_html(records, summaries or [], group_by=group_by)
    if fmt not in ("table", "markdown"):
        raise ValueError(f"format {fmt!r} is not known: choose {', '.join(FORMATS)}")
    cols = _columns(records)
    heads = [c[0] for c in cols]
    sections = group_records(records, group_by) if group_by else [(None, records)]
    labels = job_labels(records)
    note = notes(records, labels)
    out = []
    for value, members in sections:
        rows = [_cells(r, cols, labels.get(id(r))) for r in members]
        if fmt == "markdown":
            title = [f"### {group_by} = {one_line(_show(value))}", ""] if group_by else []
            out.append("\n".join(title + ["| " + " | ".join(heads) + " |", "|" + "---|" * len(heads)]
                                 + ["| " + " | ".join(_md(c) for c in r) + " |" for r in rows]))
            continue
        widths = [max(len(h), *(len(r[i]) for r in rows)) if rows else len(h) for i, h in enumerate(heads)]
        left = [h in IDENTITY for h in heads]
        line = lambda cells: "  ".join(c.ljust(w) if left[i] else c.rjust(w) for i, (c, w) in enumerate(zip(cells, widths)))  # noqa: E731
        title = [f"== {group_by} = {one_line(_show(value))} ({len(members)} runs) =="] if group_by else []
        out.append("\n".join([*title, line(heads), line(["-" * w for w in widths]), *map(line, rows)]))
    if fmt == "markdown":
        return "\n\n".join(out) + ("\n\n" + "\n".join(note) if note else "")
    return "\n\n".join(out) + ("\n" + "\n".join(note) if note else "")


FORMATS = ("table", "markdown", "json", "csv", "html")


def _md(cell: str) -> str:
    """A markdown table cell: its pipes escaped, and <, > and & as entities (a traceback's
    `<module>` in an error rendered as HTML in markdown viewers)."""
    return cell.replace("&", "&amp;").replace("<", "&lt;").replace(">", "&gt;").replace("|", "\\|")
# The terminal table (fitted to its width) lives in results/table_fit.py, which builds on the columns
# and cells above; its names stay importable from here, loaded on first use (an import at the top of
# either module would make importing the other first fail half-initialized).
_FIT_NAMES = ("rich_table", "rich_blocks", "print_rich", "print_table", "one_sweep", "NARROW_DROP")


def __getattr__(name: str):
    if name in _FIT_NAMES:
        from scalelab.results import table_fit

        return getattr(table_fit, name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def _csv(records: list[dict]) -> str:
    """Every run.json field, flattened (dotted keys; lists as JSON), one row per run."""
    flat = {id(r): flatten(r) for r in records}
    # the columns in the default order's first-seen order, whatever --sort did to the rows (a reader
    # going by position broke); booleans as JSON writes them (true, as in the cells holding JSON)
    keys = list(dict.fromkeys(k for r in sorted(records, key=sort_key) for k in flat[id(r)]))
    rows = [keys] + [["" if f.get(k) is None else dumps(f[k]) if isinstance(f[k], (list, dict, bool)) else f[k]
                      for k in keys] for f in flat.values()]
    return "\n".join(map(_csv_row, rows))


def _csv_row(values: list) -> str:
    """One CSV row, without its line end. A writer whose line end is "\\r\\n" quotes a field with a
    bare "\\r" too (a progress bar's in an error's text): with "\\n" alone it left it bare, and a
    reader split the row there."""
    buf = io.StringIO()
    csv.writer(buf, lineterminator="\r\n").writerow(values)
    return buf.getvalue()[:-2]


# The keys a table column shows as they are (its getter returns the key's value unchanged): --where
# matches a float as that column's cell formatter writes it. Step times (ms) and memory (MiB) are
# scaled for the table, so only their stored value matches.
_COLUMN_OF = {"lr": "lr", "lr/used": "lr", "world_size": "world", "global_batch_size": "batch",
              "throughput.samples_per_s": "samples/s", "throughput.tokens_per_s": "tokens/s",
              "loss.first": "loss first", "loss.final": "loss final", "scaling_efficiency": "efficiency"}


def shown_as(key: str):
    """The cell formatter ("{:.3g}") of the column that shows KEY's value as it is; None for a key
    no column shows so."""
    head = _COLUMN_OF.get(key) or _COLUMN_OF.get(key.replace("/", "."))
    return next((fmt for h, _, fmt in COLUMNS if h == head), None) if head else None


def _matches(v, want: str, fmt: str | None = None) -> bool:
    """Whether a run's value V is WANT: a number when it is numerically equal (`world_size=2.0`
    is 2), or when WANT is exactly how the table shows it in its column (FMT: `lr=0.00141` is
    0.0014142, which the table shows as 0.00141; `lr=0.001` is not). Rounding V at WANT's last
    digit matched far too much: `weight_decay=0` took 0.1, `scaling_efficiency=1` took 0.75."""
    if v is MISSING:
        return False
    if v is None:
        return want.lower() in ("null", "none", "")
    if isinstance(v, bool):
        return want.lower() == str(v).lower()
    if isinstance(v, (int, float)):
        want = want.strip()
        try:
            if float(want) == float(v):
                return True
        except (ValueError, OverflowError):
            pass
        try:
            return want == (fmt or "{}").format(v)
        except (ValueError, TypeError):
            return False
    return (json.dumps(v) if isinstance(v, (list, dict)) else str(v)) == want


def filter_records(records: list[dict], wheres: list[str]) -> list[dict]:
    """Runs matching every KEY=VALUE (VALUE may list alternatives: strategy=ddp,fsdp)."""
    for expr in wheres or []:
        key, eq, want = expr.partition("=")
        if not eq or not key.strip():
            raise SelectError(f"--where {expr!r}: expected KEY=VALUE (e.g. --where strategy=ddp)")
        check_key(records, key, "--where")
        fmt = shown_as(key)
        kept = [r for r in records if any(_matches(lookup(r, key), w, fmt) for w in want.split(","))]
        if not kept and records:   # say what the key does hold (a typo: strategy=dpp)
            values = {_show(v): v for r in records if (v := lookup(r, key)) not in (MISSING, None)}
            have = [k for k, _ in sorted(values.items(), key=lambda kv: _order(kv[1]))]
            raise SelectError(f"no run matches {expr}" + (f": {key} is {', '.join(have[:12])}"
                                                          + (", ..." if len(have) > 12 else "") if have else ""))
        records = kept
    return records

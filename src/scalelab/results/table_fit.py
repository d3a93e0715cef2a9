"""The terminal table: `scalelab compare` on a terminal and the table a run or a sweep prints at its
end (print_table), fitted to the terminal's width without cutting a value (rich_table; where even
what tells the runs apart does not fit, one block per run: rich_blocks). The columns, cells and
plain-text table are results/table.py's; its names for these stay importable from there."""
from __future__ import annotations

from scalelab.results.select import _show, group_records, sort_records
from scalelab.results.table import IDENTITY, _cells, _columns, job_labels, notes, one_line, render

# What the terminal table hides when the terminal is too narrow for every column: first the
# columns every run has the same value in (their value goes in the caption: nothing is lost), then
# these, the least telling first (named in the caption). Never hidden: the columns that say what a
# run is (job, model, precision, strategy, world, nodes, batch, lr rule: two runs that differ only
# in batch read the same without it), its throughput, efficiency and status; where even those do
# not fit, each run is a block of its own (rich_table).
NARROW_DROP = ("step ms (p90)", "state KiB/rank", "loss first", "micro x acc", "samples/s", "comm %", "MFU %", "lr",
               "peak RSS MiB", "device MiB/rank", "step ms (med)", "loss final")
_BORDER = 3          # a rich column's padding (1 each side) and its left border; the table adds 1 on the right
_STATUS_MIN = 12     # a failed run's status (its whole error, folded) gets at least this much


def one_sweep(records: list[dict]) -> str | None:
    """The name of the sweep every record is a job of (job names "SWEEP/N" of one job.sweep_dir):
    the terminal table says it once, in its title, instead of on every row. None for runs of
    several sweeps, single runs and records without a job section."""
    from pathlib import Path

    dirs = {str((r.get("job") or {}).get("sweep_dir") or "") for r in records}
    name = Path(dirs.pop()).name if len(dirs) == 1 else ""
    if name and all(str(r["job"].get("name", "")).startswith(name + "/")
                    and len(str(r["job"]["name"])) > len(name) + 1 for r in records):
        return name
    return None


def _status_width(cells: list[str]) -> tuple[int, int]:
    """(narrowest, widest) width of the status column: a failed run's error folds, at its words
    where they are not too long."""
    word = max((len(w) for c in cells for w in c.split()), default=1)
    return max(min(max(map(len, cells)), _STATUS_MIN), min(word, 2 * _STATUS_MIN)), max(map(len, cells))


def _fit_width(cells: list[str], head: str) -> tuple[int, int]:
    """(narrowest, widest) width of a column that never breaks a cell; its header may wrap at spaces."""
    need = max(map(len, cells), default=1)
    return max(need, *map(len, head.split())), max(need, len(head))


def rich_table(records: list[dict], group_by: str | None = None, sort: str | None = None, width: int = 120):
    """The terminal table (rich): renderables to print, fitted to WIDTH without cutting a value.
    One sweep's name is its title (the rows name the job number); a status column of completed
    runs only is one caption line. Where the table is wider than WIDTH, the columns every run has
    the same value in are hidden first (their value in the caption), then the least telling figures
    (NARROW_DROP, named in the caption); where the rest still does not fit, and for one run that
    does not fit whole, each run is a block of its own (rich_blocks). Failed runs are red, with
    their whole error."""
    from rich.table import Table

    if not records:
        return []
    records = sort_records(records, sort)
    view = _view(records)
    heads, column, same = view["heads"], view["column"], view["same"]
    throughput = {"tokens/s", "samples/s"} & set(heads)
    droppable = [h for h in NARROW_DROP if h in heads and h not in same
                 and not (h == "samples/s" and throughput == {"samples/s"})]   # the only throughput stays
    order = ([h for h in NARROW_DROP if h in same] + [h for h in reversed(heads) if h in same and h not in NARROW_DROP]
             + droppable)

    def widths(shown: list[str]) -> list[int] | None:
        """Each shown column's width, or None where they do not fit WIDTH."""
        ranges = [_status_width(column[h]) if h == "status" else _fit_width(column[h], h) for h in shown]
        spare = width - 1 - _BORDER * len(shown) - sum(lo for lo, _ in ranges)
        if spare < 0:
            return None
        out = [lo for lo, _ in ranges]
        # the spare width unwraps headers, the cheapest first, then widens a folded status
        for i in sorted(range(len(shown)), key=lambda i: (shown[i] == "status", ranges[i][1] - ranges[i][0])):
            grow = min(spare, ranges[i][1] - out[i])
            out[i] += grow
            spare -= grow
        return out

    hidden: list[str] = []
    fit = widths(heads)
    if fit is None and len(records) == 1:   # one run (the end of a single run): its block shows every value
        return rich_blocks(records, group_by, view)
    for head in order:
        if fit is not None:
            break
        hidden.append(head)
        fit = widths([h for h in heads if h not in hidden])
    if fit is None:   # not even what each run is and its headline figures fit
        return rich_blocks(records, group_by, view)
    for head in reversed(hidden[:-1]):   # one hidden early that fits beside the rest after all
        again = widths([h for h in heads if h not in hidden or h == head])
        if again is not None:
            hidden.remove(head)
            fit = again
    shown = [h for h in heads if h not in hidden]
    const = [h for h in hidden if h in same]
    caption = view["said"] + ([f"every run: {_pairs(const, column)}"] if const else []) + (
        [f"hidden to fit the terminal: {', '.join(h for h in hidden if h not in same)} "
         "(--format markdown has every column)"] if len(const) < len(hidden) else [])
    out = []
    sections = list(_sections(records, group_by, view["sweep"]))
    for i, (title, members) in enumerate(sections):
        # the caption is of the whole comparison: under the last section only (every group's table
        # repeated "all 12 runs completed" under its 6, 4 and 2 runs)
        last = i == len(sections) - 1
        t = Table(title=title, caption=("\n".join(caption) or None) if last else None, caption_justify="left")
        for h, w in zip(shown, fit):   # as wide as its longest cell: a cell never wraps (a header may)
            t.add_column(h, justify="left" if h in IDENTITY or h == "status" else "right", width=w, overflow="fold")
        for r in members:
            t.add_row(*(view["cells"][id(r)][h] for h in shown), style=None if r.get("status") == "completed" else "red")
        out.append(t)
    return out


def rich_blocks(records: list[dict], group_by: str | None = None, view: dict | None = None):
    """The runs one block each (field | value: every column some runs differ in), side by side as
    the width allows, and a line of what every run has the same: the terminal table's layout where
    a table of the columns that tell runs apart does not fit (each value whole)."""
    from rich.columns import Columns
    from rich.table import Table
    from rich.text import Text

    view = view or _view(records)
    fields = [h for h in view["heads"] if h != "job" and h not in view["same"]]
    out = []
    for title, members in _sections(records, group_by, view["sweep"]):
        blocks = []
        for r in members:
            row, ok = view["cells"][id(r)], r.get("status") == "completed"
            b = Table(title=f"job {row.get('job', '-')}", show_header=False, style=None if ok else "red")
            b.add_column("field", no_wrap=True)
            b.add_column("value", overflow="fold")
            for h in fields:
                b.add_row(h, row[h], style=None if ok else "red")
            blocks.append(b)
        out.append(Columns(blocks, title=title))
    lines = view["said"] + ([f"every run: {_pairs(view['same'], view['column'])}"] if view["same"] else [])
    return out + ([Text("\n".join(lines))] if lines else [])


def _view(records: list[dict]) -> dict:
    """What the terminal layouts show of RECORDS: the column heads, each run's cells by head, each
    head's cells, the heads every run has the same value in, the caption lines, the one sweep."""
    labels = job_labels(records)
    sweep = None if labels else one_sweep(records)
    if sweep:   # the job number alone: the sweep is the title
        labels = {id(r): str(r["job"]["name"])[len(sweep) + 1:] for r in records}
    cols = _columns(records)
    heads = [c[0] for c in cols]
    cells = {id(r): dict(zip(heads, _cells(r, cols, labels.get(id(r))))) for r in records}
    for r in records:   # a failed run's whole error, on one line (the plain table cuts it at 60 characters)
        if r.get("status") != "completed" and "status" in heads:
            cells[id(r)]["status"] = f"{r.get('status')}: {one_line(r.get('error', ''))}"
    said = notes(records, labels)
    if all(r.get("status") == "completed" for r in records) and "status" in heads:
        heads.remove("status")
        said.append("completed" if len(records) == 1 else f"all {len(records)} runs completed")
    column = {h: [cells[id(r)][h] for r in records] for h in heads}
    same = [h for h in heads if len(records) > 1 and h != "job" and len(set(column[h])) == 1]
    return {"heads": heads, "cells": cells, "column": column, "same": same, "said": said, "sweep": sweep}


def _pairs(heads: list[str], column: dict) -> str:
    return ", ".join(f"{h} {column[h][0]}" for h in heads)


def _sections(records: list[dict], group_by: str | None, sweep: str | None):
    """(title, runs) of each table: the sweep's name, and the group's value with --group-by."""
    for value, members in group_records(records, group_by) if group_by else [(None, records)]:
        title = ", ".join(filter(None, [f"sweep {sweep}" if sweep else None,
                                       f"{group_by} = {one_line(_show(value))}" if group_by else None]))
        yield title or None, members


def print_rich(records: list[dict], group_by: str | None = None, sort: str | None = None, console=None) -> None:
    """The terminal table (rich_table) on CONSOLE (stdout's), fitted to its width."""
    from rich.console import Console

    console = console or Console()
    for t in rich_table(records, group_by, sort, width=console.width):
        console.print(t)


def print_table(records: list[dict], log=None) -> None:
    """The run table a run or a sweep prints at its end (train.py, the sweep callback): on a
    terminal the table `scalelab compare` prints there, fitted to its width; piped, and in a log
    file, the plain text (render). With LOG (a logging.Logger whose handlers write the console and
    the job's train.log), the plain text goes to LOG's handlers that do not write to the terminal."""
    import logging
    import sys

    plain = render(records, "table")
    if not _isatty(sys.stdout):
        if log is None:
            print(plain)
        else:
            log.info(plain)
        return
    print_rich(records)
    if log is None or not log.isEnabledFor(logging.INFO):
        return
    line = log.makeRecord(log.name, logging.INFO, __file__, 0, plain, None, None)
    logger = log
    while logger is not None:   # the handlers log.info would reach, but the terminal's
        for h in logger.handlers:
            if line.levelno >= h.level and not _isatty(getattr(h, "stream", None)):
                h.handle(line)
        logger = logger.parent if logger.propagate else None


def _isatty(stream) -> bool:
    try:
        return bool(stream is not None and stream.isatty())
    except (AttributeError, ValueError, OSError):   # closed or not a file
        return False

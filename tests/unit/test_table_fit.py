"""The terminal table (`scalelab compare` on a terminal, and the table a run or a sweep prints at its
end) fits 80-, 100- and 120-column terminals without cutting a value or hiding what tells runs
apart. Walkthrough: the README's sweep `-m strategy=single,ddp trainer.devices=1,2
data.global_batch_size=16,32` showed `wor…`/`tok…` and `110…` at 80 columns, a cropped border at
100, and at 120 hid `batch` while "completed" and the sweep's timestamp filled every row (two jobs
differing only in batch read the same); the table printed at the end of `make run` was ~200
columns of plain text whatever the terminal."""
from __future__ import annotations

import io
import logging
import re
import sys

import pytest
from rich.console import Console

from scalelab.results.table import rich_table

SWEEP = "2026-12-02_15-40-46"
ANSI = re.compile(r"\x1b\[[0-9;]*m")


def _rec(num: int, strategy: str, world: int, batch: int, tokens: float, eff: float, *, status="completed",
         sweep_dir="/tmp/outputs/sweeps/" + SWEEP) -> dict:
    """A run.json of the README sweep as train.py and the worker write it (the fields the table reads)."""
    rec = {"status": status, "strategy": strategy, "world_size": world, "num_nodes": 1, "devices_per_node": world,
           "global_batch_size": batch, "per_device_batch_size": batch // world, "accumulate_grad_batches": 1,
           "lr_rule": "none", "lr": 0.003, "precision": "32-true", "model": {"name": "gpt_small"},
           "throughput": {"samples_per_s": tokens / 64, "tokens_per_s": tokens},
           "step_time_s": {"median": batch * 64 / tokens, "p90": 1.3 * batch * 64 / tokens},
           "memory": {"peak_rss_bytes_per_rank": [(480 + num) * 2**20] * world,
                      "model_state_bytes_per_rank": [2122 * 2**10] * world},
           "loss": {"first": 5.5419 + batch / 10000, "final": 3.0 + num / 100},
           "mfu": {"value": tokens / 120000}, "breakdown": {"comm_fraction": (world - 1) * 0.2},
           "scaling_efficiency": eff, "scaling_baseline_world": 1, "scaling_kind": "strong",
           "job": {"name": f"{SWEEP}/{num}", "sweep_dir": sweep_dir, "num": num}}
    if status != "completed":
        rec.update(error="RuntimeError: the ranks ran out of memory on rank 1 (peak 9.1 GiB of 8 GiB)",
                   throughput={"samples_per_s": None, "tokens_per_s": None},
                   step_time_s={"median": None, "p90": None}, loss={"first": None, "final": None})
    return rec


def readme_sweep() -> list[dict]:
    """The 8 runs of README's sweep (single,ddp x devices 1,2 x batch 16,32), tokens/s 5 digits."""
    return [_rec(4, "ddp", 1, 16, 11076, 1.0), _rec(6, "ddp", 2, 16, 25592, 1.16),
            _rec(5, "ddp", 1, 32, 21324, 1.0), _rec(7, "ddp", 2, 32, 18206, 0.43),
            _rec(0, "single", 1, 16, 30829, 1.0), _rec(2, "single", 2, 16, 19696, 0.32),
            _rec(1, "single", 1, 32, 33839, 1.0), _rec(3, "single", 2, 32, 13409, 0.2)]


def draw(records, width, **kw) -> str:
    console = Console(width=width, record=True)
    for t in rich_table(records, width=width, **kw):
        console.print(t)
    return console.export_text(styles=False)


def rows(text: str) -> list[list[str]]:
    """The body rows of a drawn table, cells stripped."""
    return [[c.strip() for c in line.strip("│").split("│")] for line in text.splitlines()
            if line.startswith("│") and line.strip("│ ")]


@pytest.mark.parametrize("width", [80, 100, 120])
def test_readme_sweep_fits_and_tells_every_run_apart(width):
    recs = readme_sweep()
    text = draw(recs, width)
    assert max(len(line) for line in text.splitlines()) <= width, text          # nothing cropped
    assert "…" not in text, text                                                  # nothing cut
    body = rows(text)
    assert len(body) == 8 and len({tuple(r) for r in body}) == 8, text          # every run its own row
    heads = " ".join(line for line in text.splitlines() if line.startswith("┃"))
    for head in ("strategy", "world", "batch"):                                   # the sweep's dimensions
        assert head in heads, (head, text)
    for r in recs:   # every run's whole numbers, on its own row (found by its job number)
        row = next(c for c in body if c[0] == str(r["job"]["num"]))
        assert {r["strategy"], str(r["world_size"]), str(r["global_batch_size"]),
                f"{r['throughput']['tokens_per_s']:.0f}", f"{r['scaling_efficiency']:.2f}"} <= set(row), (row, text)
    # the sweep once, in the title; "completed" once, under the table; constants said, not dropped
    assert text.count(SWEEP) == 1 and f"sweep {SWEEP}" in text.splitlines()[0]
    assert "all 8 runs completed" in text and "completed │" not in text
    assert "lr 0.003" in text or "0.003 │" in text
    shown = set(heads.split())
    for hidden in ("p90", "first"):   # a hidden column is named under the table
        assert hidden in shown or hidden in text.split("hidden to fit the terminal:")[-1], text


def test_varying_columns_outlast_constant_ones():
    """Where not every column fits, a column every run has the same value in goes first (its value
    under the table), before any column the runs differ in."""
    recs = readme_sweep()
    text = draw(recs, 120)
    caption = " ".join(text.split("└")[-1].split())
    assert "every run: state KiB/rank 2122, lr 0.003" in caption, caption
    assert "batch" in text and "micro" in text and "samples/s" in text


def test_narrow_terminal_shows_every_value_in_blocks():
    """Where not even what tells the runs apart and their throughput fit, each run is a block."""
    recs = readme_sweep()
    text = draw(recs, 60)   # still a table of them
    assert "┃ job ┃ strategy ┃ world ┃ batch ┃ tokens/s ┃" in text and "…" not in text
    text = draw(recs, 50)
    assert max(len(line) for line in text.splitlines()) <= 50 and "…" not in text
    for r in recs:
        assert f"job {r['job']['num']}" in text
        for v in (f"{r['throughput']['tokens_per_s']:.0f}", f"{r['throughput']['samples_per_s']:.1f}",
                  f"{r['loss']['final']:.4f}", f"{r['step_time_s']['p90'] * 1e3:.1f}"):
            assert v in text, (v, text)
    assert "every run:" in text and "lr 0.003" in text and "all 8 runs completed" in text


def test_failed_run_keeps_its_status_column_and_whole_error():
    recs = readme_sweep()
    recs[3] = _rec(7, "ddp", 2, 32, 1, None, status="failed")
    for width in (100, 120):
        text = draw(recs, width)
        assert max(len(line) for line in text.splitlines()) <= width and "…" not in text
        status = " ".join(line.rsplit("│", 2)[-2].strip() for line in text.splitlines() if line.count("│") > 2)
        assert recs[3]["error"] in " ".join(status.split()), text
        assert "completed" in status and "all 8 runs completed" not in text


def test_runs_of_several_sweeps_keep_their_names_and_group_titles():
    recs = readme_sweep()[:4] + [_rec(9, "ddp", 2, 16, 20000, 1.1, sweep_dir="/tmp/other/" + SWEEP)]
    recs[-1]["job"]["name"] = "other/9"
    text = draw(recs, 120)
    assert f"{SWEEP}/4" in text and "other/9" in text and "sweep " not in text
    text = draw(readme_sweep(), 120, group_by="strategy")
    assert f"sweep {SWEEP}, strategy = ddp" in text and f"sweep {SWEEP}, strategy = single" in text
    # the whole comparison's caption once, under the last group (it followed every group's table)
    assert text.count("every run:") == 1 and text.index("every run:") > text.index("strategy = single")


def test_one_run_too_wide_for_the_terminal_is_one_block():
    rec = _rec(0, "ddp", 2, 16, 25592, None, sweep_dir=None)
    rec["job"]["name"] = SWEEP
    text = draw([rec], 80)
    assert max(len(line) for line in text.splitlines()) <= 80
    for v in ("25592", "399.9", "ddp", "8x1", "2122", "completed"):
        assert v in text, (v, text)


# ------------------------------------------------------------------ the table at a run's end
class _Tty(io.StringIO):
    def isatty(self):
        return True


def test_print_table_on_a_terminal_fits_it_and_keeps_the_log_plain(monkeypatch, tmp_path):
    from scalelab.results.table import print_table, render

    tty = _Tty()
    monkeypatch.setattr(sys, "stdout", tty)
    monkeypatch.setenv("COLUMNS", "100")
    log = logging.getLogger("scalelab.test_print_table")
    log.propagate, log.level = False, logging.INFO
    to_file = logging.FileHandler(tmp_path / "train.log")
    to_console = logging.StreamHandler(tty)
    log.handlers = [to_console, to_file]
    try:
        print_table(readme_sweep(), log)
    finally:
        log.handlers = []
        to_file.close()
    shown = ANSI.sub("", tty.getvalue())
    assert max(len(line) for line in shown.splitlines()) <= 100 and f"sweep {SWEEP}" in shown
    assert "job " not in shown.splitlines()[0] and render(readme_sweep(), "table") not in shown  # not plain text too
    assert (tmp_path / "train.log").read_text().strip() == render(readme_sweep(), "table").strip()


def test_print_table_piped_is_the_plain_text(capsys):
    from scalelab.results.table import print_table, render

    print_table(readme_sweep())
    assert capsys.readouterr().out.strip() == render(readme_sweep(), "table").strip()


def test_sweep_summary_on_a_terminal_prints_the_fitted_table(monkeypatch, tmp_path):
    """What `make run` and every sweep print at their end (results/callbacks.summarize_sweep)."""
    from scalelab.results import callbacks, report
    from scalelab.results.record import write_json

    sweep = tmp_path / SWEEP
    for r in readme_sweep():
        r["job"]["sweep_dir"] = str(sweep)
        for k in ("scaling_efficiency", "scaling_baseline_world", "scaling_kind"):
            r.pop(k)
        (sweep / str(r["job"]["num"])).mkdir(parents=True)
        write_json(sweep / str(r["job"]["num"]) / "run.json", r)
    monkeypatch.setattr(report, "write_report", lambda path, *a, **k: path)   # the dashboard: not this test's
    tty = _Tty()
    monkeypatch.setattr(sys, "stdout", tty)
    monkeypatch.setenv("COLUMNS", "80")
    callbacks.summarize_sweep(sweep)
    shown = ANSI.sub("", tty.getvalue())
    table = shown.split("sweep summary:")[0].split(" failed ==")[-1]   # the header and paths: as they are
    assert max(len(line) for line in table.splitlines()) <= 80, shown
    assert "batch" in shown and "…" not in shown and "11076" in shown and "sweep.json" in shown


def test_blocks_of_a_record_without_a_job_name():
    """An old or hand-made run.json without a job section, on a terminal too narrow for the table:
    a block titled `job -` (rich_blocks raised KeyError: 'job')."""
    from rich.console import Console

    from scalelab.results.table import rich_table

    console = Console(width=30, record=True, force_terminal=True)
    for t in rich_table([{"status": "failed", "error": "boom", "strategy": "ddp", "world_size": 2}], width=30):
        console.print(t)
    assert "job -" in console.export_text()

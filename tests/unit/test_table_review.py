"""The comparison table of a failed run with a multi-line error (one line per cell; CSV quoted whole),
and of runs whose ranks x threads exceeded their node's cores (marked "!", with a footnote)."""
from __future__ import annotations

import csv
import io
import json
import shutil
import subprocess

import pytest

from scalelab.results.record import read_records, write_json
from scalelab.results.table import render

from .test_report import _rec

ERROR = 'Traceback (most recent call last):\n  File "w.py", line 3, in <module>\nValueError: bad <shape>\n'
SHORT_ERROR = "ValueError: bad\r\n  second line\n"


def _failed(num=2, error=ERROR):
    rec = _rec(num, "zero2", 2, 16, None, status="failed")
    rec["error"] = error
    return rec


def _crowded(num=1):
    """8 CPU ranks of 1 thread on a 2-core host, as the worker records it (hardware.host_cores)."""
    return _rec(num, "ddp", 8, 16, 150.0, devices_per_node=8, hardware={"host_cores": 2})


def _runs():
    return [_rec(0, "ddp", 1, 16, 100.0, hardware={"host_cores": 2}), _crowded(), _failed()]


# ------------------------------------------------------------------- a multi-line error: one line per cell
def test_plain_table_row_of_a_multi_line_error_is_one_line():
    lines = render([_rec(0, "ddp", 1, 16, 100.0), _failed(1, SHORT_ERROR)], "table").splitlines()
    assert len(lines) == 4                                          # header, rule, two rows: nothing else
    assert lines[-1].endswith("failed: ValueError: bad | second line")
    assert len({len(line) for line in lines}) == 1                  # the columns line up


def test_plain_table_cuts_the_joined_error_at_60_characters():
    """At a word's end with "...": cut at 60 it read "...line 3, in" (a SLURM error: "SIGTERM: checkp")."""
    last = render([_rec(0, "ddp", 1, 16, 100.0), _failed()], "table").splitlines()[-1]
    assert last.endswith('failed: Traceback (most recent call last): | File "w.py", line 3...')


def test_markdown_row_of_a_multi_line_error_is_one_line():
    text = render([_rec(0, "ddp", 1, 16, 100.0), _failed(1, SHORT_ERROR)], "markdown")
    rows = text.splitlines()
    assert len(rows) == 4 and all(r.startswith("| ") and r.endswith(" |") for r in rows[2:])
    assert rows[-1].endswith("| failed: ValueError: bad \\| second line |")


def test_group_by_the_error_titles_each_section_on_one_line():
    text = render([_failed(1, SHORT_ERROR)], "table", group_by="error")
    assert text.splitlines()[0] == "== error = ValueError: bad | second line (1 runs) =="


def test_csv_quotes_an_error_with_a_bare_carriage_return():
    """A progress bar's "\\r" in an error: the CSV field is quoted, and a reader gets the run whole."""
    err = "loading 10%\rloading 100%\rRuntimeError: boom"     # no "\n": the old writer left it unquoted
    text = render([_rec(0, "ddp", 1, 16, 100.0), _failed(1, err)], "csv")
    rows = list(csv.reader(io.StringIO(text, newline="")))
    assert len(rows) == 3 and len({len(r) for r in rows}) == 1
    assert rows[2][rows[0].index("error")] == err                  # the whole error, as run.json has it
    assert '"loading 10%\rloading 100%\rRuntimeError: boom"' in text


def test_html_run_table_cell_is_one_line_and_escaped_and_hover_has_the_whole_error(tmp_path):
    from scalelab.results.report import tables

    (tmp_path / "0").mkdir()
    write_json(tmp_path / "0" / "run.json", _failed(0, ERROR))
    recs = read_records([tmp_path])
    assert recs[0]["error"] == ERROR                                 # run.json keeps the whole error
    summary, _ = tables(recs)
    assert '<td>failed: Traceback (most recent call last): | File &quot;w.py&quot;, line 3...</td>' in summary
    assert ('title="Traceback (most recent call last):\n  File &quot;w.py&quot;, line 3, in &lt;module&gt;\n'
            'ValueError: bad &lt;shape&gt;\n"') in summary


def test_terminal_table_shows_the_whole_error_on_one_line():
    from rich.console import Console

    from scalelab.results.table_fit import rich_table

    console = Console(width=300, record=True, force_terminal=True, color_system="standard")
    for t in rich_table([_rec(0, "ddp", 1, 16, 100.0), _failed(1, SHORT_ERROR)], width=300):
        console.print(t)
    text = console.export_text(styles=False)
    assert "│ failed: ValueError: bad | second line │" in text


# ---------------------------------------------------------------------- oversubscribed runs: marked, noted
NOTE = ("! oversubscribed: fx/1 (8 ranks x 1 thread(s) on 2 cores): the ranks shared cores, so their step time, "
        "throughput, scaling efficiency and MFU measure that contention, not the strategy, and do not compare "
        "with runs that fit the host")


def test_plain_table_marks_an_oversubscribed_run_and_says_why():
    lines = render(_runs(), "table").splitlines()
    heads = lines[0].split()
    world = [line.split()[heads.index("world")] for line in lines[2:5]]
    assert world == ["1", "8!", "2"]
    assert lines[-1] == NOTE and len(lines) == 6


def test_markdown_marks_an_oversubscribed_run_and_says_why():
    text = render(_runs(), "markdown")
    assert "| fx/1 | ddp | 8! | 16 | 2x1 |" in text and "| fx/0 | ddp | 1 | 16 | 16x1 |" in text
    assert text.endswith("\n\n" + NOTE)


@pytest.mark.parametrize("hardware, devices, flagged", [
    ({"accelerator": "cpu", "threads_per_rank": 2, "host_cores": 4}, 2, False),    # 2 x 2 on 4: fits
    ({"accelerator": "cpu", "threads_per_rank": 4, "host_cores": 4}, 2, True),     # srun: 4 threads, 2 CPUs a task
    ({"accelerator": "cuda", "threads_per_rank": 8, "host_cores": 4}, 2, False),   # GPU ranks: not counted
    ({"accelerator": "cpu", "threads_per_rank": 1}, 8, False),                     # an older record: no cores
])
def test_which_runs_are_oversubscribed(hardware, devices, flagged):
    from scalelab.results.table import oversubscribed

    rec = _rec(0, "ddp", devices, 16, 100.0, hardware=hardware)
    assert (oversubscribed(rec) is not None) == flagged
    assert ("oversubscribed" in render([rec], "table")) == flagged


def test_html_report_marks_the_row_and_notes_it():
    page = render(_runs(), "html")
    assert '<tr class=oversubscribed title="oversubscribed: 8 ranks x 1 thread(s) on 2 cores (figures not ' \
           'comparable)"><td>fx/1</td><td>ddp</td><td>8!</td>' in page
    assert f'<p class="note">{NOTE}</p>' in page


def test_terminal_table_marks_the_run_and_says_why():
    from rich.console import Console

    from scalelab.results.table_fit import rich_table

    console = Console(width=400, record=True, force_terminal=True, color_system="standard")
    for t in rich_table(_runs(), width=400):
        console.print(t)
    text = console.export_text(styles=False)
    row = next(line for line in text.splitlines() if "fx/1" in line)
    assert row.split("│")[3].strip() == "8!" and NOTE in text


@pytest.mark.skipif(shutil.which("node") is None, reason="needs node to run the page's sort")
def test_the_html_sort_reads_a_marked_world_as_its_number():
    from scalelab.results.report import CMP_JS

    cells = ["8!", "2", "16", "1"]
    js = CMP_JS + f"const c={json.dumps(cells)};console.log(JSON.stringify([...c].sort((a,b)=>sortCmp(a,b,true))));"
    out = subprocess.run(["node", "-e", js], capture_output=True, text=True, check=True).stdout
    assert json.loads(out) == ["1", "2", "8!", "16"]


@pytest.mark.skipif(shutil.which("node") is None, reason="needs node to run the page's sort")
def test_the_html_sort_reads_an_efficiency_cell_by_its_number():
    # efficiency cells carry words after the number; sorted as text "10.5 (vs 2)" came before "2.1 weak"
    from scalelab.results.report import CMP_JS

    cells = ["2.1 weak", "-", "10.5 (vs 2)", "0.80* (vs short run)", "0.95", "sw/0"]
    js = CMP_JS + f"const c={json.dumps(cells)};console.log(JSON.stringify([...c].sort((a,b)=>sortCmp(a,b,true))));"
    out = subprocess.run(["node", "-e", js], capture_output=True, text=True, check=True).stdout
    assert json.loads(out)[:4] == ["0.80* (vs short run)", "0.95", "2.1 weak", "10.5 (vs 2)"]


@pytest.mark.skipif(shutil.which("node") is None, reason="needs node to run the page's sort")
def test_the_html_sort_orders_job_names_and_splits_by_their_numbers():
    # plain localeCompare put sw1/10 before sw1/2 and 16x1 before 4x1
    from scalelab.results.report import CMP_JS

    for cells, want in ((["sw1/10", "sw1/2", "sw1/1"], ["sw1/1", "sw1/2", "sw1/10"]),
                        (["16x1", "4x1", "8x2"], ["4x1", "8x2", "16x1"])):
        js = CMP_JS + f"const c={json.dumps(cells)};console.log(JSON.stringify([...c].sort((a,b)=>sortCmp(a,b,true))));"
        out = subprocess.run(["node", "-e", js], capture_output=True, text=True, check=True).stdout
        assert json.loads(out) == want


def test_the_dashboard_names_its_sweep_says_cpu_figures_are_not_gpu_speedups_and_draws_lr_on_a_log_axis():
    from scalelab.results.report import figure, render_html

    cpu = {"status": "completed", "strategy": "ddp", "world_size": 2, "devices_per_node": 2, "job": {"name": "sw/0"},
           "hardware": {"accelerator": "cpu"}, "throughput": {"samples_per_s": 10.0}}
    page = render_html([cpu], [{"sweep_dir": "/o/sweeps/2026-12-03_19-00-00", "groups": [], "failed": []}])
    assert "<title>ScaleLab comparison: 2026-12-03_19-00-00</title>" in page
    assert "CPU ranks share one host&#x27;s memory bus" in page
    gpu = {**cpu, "hardware": {"accelerator": "cuda"}}
    assert "memory bus" not in render_html([gpu], [])
    lr = figure({"id": "lr_scaling", "kind": "line", "title": "t", "x_title": "x", "y_title": "y", "notes": [],
                 "barmode": None, "traces": [{"name": "a", "x": [8, 16], "y": [4.075, 3.998]}]})
    # the y axis from 0 drew 3.998 and 4.075 as one flat line; batch sizes double
    assert lr["layout"]["yaxis"]["rangemode"] == "normal" and lr["layout"]["xaxis"]["type"] == "log"


def test_the_lr_warm_up_is_a_column_where_runs_differ_in_it():
    # lr_search sweeps the warm-up with the LR: its trials could not be told apart in the table
    from scalelab.results.table import render

    def trial(n, lr, warm):
        return {"status": "completed", "strategy": "ddp", "world_size": 1, "lr": lr, "job": {"name": f"s/{n}"},
                "config": {"lr_scaling": {"rule": "none", "warmup_steps": warm}}}

    rows = render([trial(0, 0.003, 0), trial(1, 0.001, 0.25)], "markdown").splitlines()
    col = [c.strip() for c in rows[0].split("|")].index("lr warmup")
    assert [[c.strip() for c in r.split("|")][col] for r in rows[2:4]] == ["0", "0.25"]
    assert "lr warmup" not in render([trial(0, 0.003, 0), trial(1, 0.001, 0)], "markdown").splitlines()[0]

"""`scalelab compare` selection (--where / --sort / --group-by), its formats, and the dashboard's
chart data on a hand-written fixture sweep (no browser: tests/integration/test_dashboard.py opens
the HTML in Chromium). Every expected figure below is worked out by hand from the fixture."""
from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from scalelab.results import charts
from scalelab.results.record import read_records, write_json
from scalelab.results.sweep import aggregate, attach_efficiency
from scalelab.results.table import SelectError, filter_records, group_records, lookup, render, sort_records

MIB = 2**20
GOLDEN = Path(__file__).resolve().parents[1] / "golden" / "compare.md"
NANO = {"name": "gpt_nano", "kind": "gpt", "n_params": 135808, "n_layers": 2, "d_model": 64, "n_heads": 4,
        "vocab_size": 256, "seq_len": 64, "ffn_hidden": 256}


def _rec(num, strategy, world, batch, thr, *, rule="none", lr=0.001, final=3.0, status="completed", **extra):
    """A run.json as the worker writes it (the fields the table and charts read), 64 tokens/sample."""
    cfg = {"strategy": {"name": strategy}, "model": {"name": "gpt_nano"}, "optim": {"name": "adamw"},
           "trainer": {"devices": world, "max_steps": 20}, "data": {"global_batch_size": batch},
           "lr_scaling": {"rule": rule, "base_batch_size": 16}, "cache_dir": "/nonexistent/scalelab-cache",
           "logger": {"name": "wandb", "api_token": "<redacted>"}}
    rec = {"status": status, "strategy": strategy, "world_size": world, "num_nodes": 1, "devices_per_node": world,
           "global_batch_size": batch, "per_device_batch_size": batch // world, "accumulate_grad_batches": 1,
           "lr_rule": rule, "base_lr": 0.001, "base_batch_size": 16, "lr": lr, "lr_final": lr, "steps": 20,
           "parallel": {"dp": world, "tp": 1, "pp": 1}, "precision": "32-true", "optimizer": "adamw",
           "model": {"name": "gpt_nano"}, "hardware": {"accelerator": "cpu", "threads_per_rank": 1},
           "throughput": {"samples_per_s": thr, "tokens_per_s": None if thr is None else thr * 64},
           "step_time_s": {"median": 0.1, "p90": 0.12},
           "memory": {"peak_rss_bytes_per_rank": [100 * MIB] * world, "model_state_bytes_per_rank": [4 * MIB] * world},
           "loss": {"first": 5.0, "final": final, "curve": [[1, 5.0], [2, final]]},
           "mfu": {"value": 0.1, "hardware_profile": "this_cpu"},
           "job": {"name": f"fx/{num}"}, "config": cfg}
    if status != "completed":
        rec.update(throughput={"samples_per_s": None, "tokens_per_s": None}, step_time_s={"median": None, "p90": None},
                   memory={"peak_rss_bytes_per_rank": [], "model_state_bytes_per_rank": []},
                   loss={"first": None, "final": None, "curve": []}, error="RuntimeError: out of memory (rank 1)")
        rec.pop("mfu")
    for k, v in extra.items():
        rec[k] = v if not isinstance(v, dict) or not isinstance(rec.get(k), dict) else {**rec[k], **v}
    return rec


def _states(params, grads, opt, world):
    return [{"params": params * MIB, "grads": grads * MIB, "optimizer": opt * MIB}] * world


def _breakdown(*ranks):
    return {"per_rank": [{"compute_s": c, "transfer_s": t, "wait_s": w, "comm_s": t + w, "step_s": c + t + w}
                         for c, t, w in ranks], "comm_fraction": 0.2, "wait_fraction": 0.05}


def fixture_records() -> list[dict]:
    """9 runs: ddp at 1 and 2 ranks, batch 16/32 x LR rule none/linear at 2 ranks, fsdp at 1 and 2
    ranks, a failed zero2 run, and a GPU-style single run (device memory, h200 profile)."""
    return [
        _rec(0, "ddp", 1, 16, 100.0, final=3.2,
             memory={"model_state_breakdown_per_rank": _states(1, 1, 2, 1)}),
        _rec(1, "ddp", 2, 16, 150.0, final=3.0,
             memory={"model_state_breakdown_per_rank": _states(1, 1, 2, 2),
                     "peak_rss_bytes_per_rank": [90 * MIB, 80 * MIB]},
             breakdown=_breakdown((0.010, 0.002, 0.0), (0.009, 0.002, 0.001))),
        _rec(2, "ddp", 2, 32, 180.0, final=2.9),
        _rec(3, "ddp", 2, 16, 140.0, rule="linear", final=3.1),
        _rec(4, "ddp", 2, 32, 170.0, rule="linear", lr=0.002, final=2.5, lr_final=0.0002),
        _rec(5, "fsdp", 1, 16, 90.0, final=3.3, mfu={"hardware_profile": "h100_sxm"}),  # no model shape
        _rec(6, "fsdp", 2, 16, 144.0, final=3.1, breakdown=_breakdown((0.020, 0.004, 0.0), (0.018, 0.004, 0.002))),
        _rec(7, "zero2", 2, 16, None, status="failed"),
        _rec(8, "single", 1, 16, 1000.0, final=3.4, precision="bf16-mixed", model=NANO,
             hardware={"accelerator": "cuda", "threads_per_rank": 8},
             memory={"model_state_breakdown_per_rank": _states(4, 4, 8, 1), "peak_rss_bytes_per_rank": [5000 * MIB],
                     "peak_device_bytes_per_rank": [1024 * MIB], "model_state_bytes_per_rank": [16 * MIB]},
             mfu={"value": 0.3, "hardware_profile": "h200"}, step_time_s={"median": 0.05, "p90": 0.06}),
    ]


def make_sweep(root: Path) -> Path:
    root.mkdir(parents=True, exist_ok=True)
    for i, r in enumerate(fixture_records()):
        (root / str(i)).mkdir()
        r["job"]["sweep_dir"] = str(root.resolve())   # a multirun's job, as train.py records it
        write_json(root / str(i) / "run.json", r)
    return root


@pytest.fixture()
def sweep(tmp_path):
    return make_sweep(tmp_path / "fx")


@pytest.fixture()
def loaded(sweep):
    recs = read_records([sweep])
    summary = aggregate(sweep, write=False)
    attach_efficiency(recs, summary)
    return recs, summary


def _names(recs):
    return [r["job"]["name"] for r in recs]


# ------------------------------------------------------------------------------------- selection
def test_keys_are_run_json_paths_and_wandb_names(loaded):
    recs, _ = loaded
    r1 = next(r for r in recs if r["job"]["name"] == "fx/1")
    assert lookup(r1, "throughput.tokens_per_s") == lookup(r1, "throughput/tokens_per_s") == 9600.0
    assert lookup(r1, "config.lr_scaling.rule") == "none" and lookup(r1, "memory.peak_rss_bytes_per_rank.1") == 80 * MIB
    assert lookup(r1, "step_time/median_s") == 0.1 and lookup(r1, "memory/peak_rss_bytes_max") == 90 * MIB
    assert lookup(r1, "scaling_efficiency") == pytest.approx(0.75) and lookup(r1, "job") == "fx/1"


def test_where_sort_group(loaded):
    recs, _ = loaded
    assert _names(filter_records(recs, ["strategy=ddp", "world_size=2"])) == ["fx/1", "fx/2", "fx/3", "fx/4"]
    assert sorted(_names(filter_records(recs, ["strategy=fsdp,zero2"]))) == ["fx/5", "fx/6", "fx/7"]
    assert _names(filter_records(recs, ["config.optim.name=adamw", "lr_rule=linear"])) == ["fx/3", "fx/4"]
    assert _names(filter_records(recs, ["status=failed"])) == ["fx/7"]
    by_tok = sort_records(recs, "throughput.tokens_per_s")
    assert _names(by_tok) == ["fx/5", "fx/0", "fx/3", "fx/6", "fx/1", "fx/4", "fx/2", "fx/8", "fx/7"]  # None last
    assert _names(sort_records(recs, "-throughput.tokens_per_s"))[:2] == ["fx/8", "fx/2"]
    assert _names(sort_records(recs, "-throughput.tokens_per_s"))[-1] == "fx/7"
    # default order: strategy, global batch, world size, job
    assert _names(sort_records(recs, None)) == ["fx/0", "fx/1", "fx/3", "fx/2", "fx/4", "fx/5", "fx/6", "fx/8",
                                                "fx/7"]
    groups = group_records(sort_records(recs, None), "world_size")
    assert [(v, _names(m)) for v, m in groups] == [(1, ["fx/0", "fx/5", "fx/8"]),
                                                   (2, ["fx/1", "fx/3", "fx/2", "fx/4", "fx/6", "fx/7"])]


@pytest.mark.parametrize("args,needle", [
    (["--sort", "throughput.nope"], "--sort 'throughput.nope': no run has this key"),
    (["--group-by", "nope"], "--group-by 'nope': no run has this key"),
    # a misspelt key names the run.json path it is close to; a second --sort was dropped silently (review)
    (["--sort=-throughput.tokens_per_sec"], "no run has this key; did you mean throughput.tokens_per_s or throughput.samples_per_s? (keys are"),
    (["--where", "config.optim.nam=adamw"], "did you mean config.optim.name?"),
    (["--sort", "world_size", "--sort", "strategy"], "error: --sort world_size strategy: give one key"),
    (["--group-by", "strategy", "--group-by=lr_rule"], "error: --group-by strategy lr_rule: give one key"),
    (["--where", "nope=1"], "--where 'nope': no run has this key"),
    (["--where", "strategy"], "--where 'strategy': expected KEY=VALUE"),
    (["--where", "strategy=tp"], "no run matches strategy=tp: strategy is ddp, fsdp, single, zero2"),
    (["--where", "strategy=ddp", "--where", "world_size=8"], "no run matches world_size=8: world_size is 1, 2"),
])
def test_bad_keys_are_one_line_exit_2(sweep, args, needle):
    proc = subprocess.run([sys.executable, "-m", "scalelab.cli", "compare", str(sweep), *args],
                          capture_output=True, text=True)
    assert proc.returncode == 2 and proc.stdout == "", proc.stderr
    assert proc.stderr.count("\n") == 1 and needle in proc.stderr, proc.stderr


def test_select_error_is_raised_by_the_library(loaded):
    with pytest.raises(SelectError):
        sort_records(loaded[0], "nope")


def test_compare_filters_groups_and_sorts_on_the_command_line(sweep, tmp_path):
    out = tmp_path / "o.json"
    proc = subprocess.run([sys.executable, "-m", "scalelab.cli", "compare", str(sweep), "--format", "json",
                           "--where", "strategy=ddp", "--group-by", "lr_rule", "--sort=-global_batch_size",
                           "--out", str(out)], capture_output=True, text=True)
    assert proc.returncode == 0, proc.stderr
    doc = json.loads(out.read_text())
    assert doc["group_by"] == "lr_rule"
    assert [(g["value"], _names(g["runs"])) for g in doc["groups"]] == [
        ("linear", ["fx/4", "fx/3"]), ("none", ["fx/2", "fx/0", "fx/1"])]
    table = subprocess.run([sys.executable, "-m", "scalelab.cli", "compare", str(sweep), "--group-by", "strategy",
                            "--where", "world_size=2"], capture_output=True, text=True).stdout
    assert "== strategy = ddp (4 runs) ==" in table and "== strategy = zero2 (1 runs) ==" in table
    assert "fx/0" not in table


def test_csv_has_every_field_flattened(loaded):
    import csv
    import io

    recs, _ = loaded
    rows = list(csv.DictReader(io.StringIO(render(recs, "csv"))))
    assert len(rows) == 9
    r8 = next(r for r in rows if r["job.name"] == "fx/8")
    assert r8["memory.peak_device_bytes_per_rank"] == json.dumps([1024 * MIB])
    assert r8["throughput.tokens_per_s"] == "64000.0" and r8["config.optim.name"] == "adamw"
    assert next(r for r in rows if r["job.name"] == "fx/7")["error"].startswith("RuntimeError")


def test_rich_table_fits_and_marks_failed_runs_red(loaded):
    from rich.console import Console

    from scalelab.results.table import rich_table

    recs, _ = loaded
    for width in (100, 300):
        console = Console(width=width, record=True, force_terminal=True, color_system="standard")
        for t in rich_table(recs, width=width):
            console.print(t)
        text = console.export_text(styles=False, clear=False)
        assert max(len(line) for line in text.splitlines()) <= width
        assert ("hidden to fit the terminal: step ms (p90)" in text) == (width == 100)   # 300: every column
        assert "sweep fx" in text and "│ 8 " in text and "64000" in text and "0.75" in text   # job, tokens/s, eff.
        styled = console.export_text(styles=True)
        red = [line for line in styled.splitlines() if "\x1b[31m" in line]
        assert red and any("zero2" in line for line in red) and not any("single" in line for line in red)
        status = "".join(line.rsplit("│", 2)[-2] for line in text.splitlines() if line.count("│") > 2)
        assert "failed: RuntimeError: out of memory (rank 1)" in " ".join(status.split())   # whole, wrapped


def test_markdown_matches_golden(loaded):
    recs, _ = loaded
    text = render(recs, "markdown") + "\n"
    if os.environ.get("SCALELAB_UPDATE_GOLDEN") == "1":   # after a deliberate change: rewrite, review the diff
        GOLDEN.write_text(text)
    assert text == GOLDEN.read_text()


def test_plain_table_unchanged_for_files_and_pipes(loaded):
    """Non-tty output keeps the plain table the README and tests read (header, rule, rows)."""
    recs, _ = loaded
    lines = render(recs, "table").splitlines()
    assert lines[0].startswith("job") and set(lines[1].replace(" ", "")) == {"-"} and len(lines) == 12
    assert "failed: RuntimeError: out of memory" in lines[10] and lines[11].startswith("efficiency - (fx/3")


# ------------------------------------------------------------------------------------- charts
def test_efficiency_strong_and_weak_apart(loaded):
    recs, summary = loaded
    strong = charts.efficiency([summary], recs, "strong")
    assert [(t["name"], t["x"], t["y"]) for t in strong["traces"]] == [
        ("ddp b16", [1, 2], [1.0, pytest.approx(0.75)]),      # 150 / (2 x 100 / 1)
        ("fsdp b16", [1, 2], [1.0, pytest.approx(0.8)]),      # 144 / (2 x 90 / 1)
        ("ideal", [1, 2], [1.0, 1.0])]
    assert strong["traces"][-1].get("dash") and not strong["traces"][0].get("dash")
    weak = charts.efficiency([summary], recs, "weak")
    # per-rank batch 16: ddp x1 b16 (100/s) and ddp x2 b32 (180/s): 180 / (2 x 100) = 0.9
    assert [(t["name"], t["x"], t["y"]) for t in weak["traces"]] == [
        ("ddp 16/rank", [1, 2], [1.0, pytest.approx(0.9)]), ("ideal", [1, 2], [1.0, 1.0])]


def test_efficiency_labels_by_group_and_keeps_only_selected_runs(loaded):
    recs, summary = loaded
    only = [r for r in recs if r["strategy"] == "ddp"]
    strong = charts.efficiency([summary], only, "strong", group_by="config.optim.name")
    assert [t["name"] for t in strong["traces"]] == ["ddp b16 [config.optim.name=adamw]", "ideal"]
    none = charts.efficiency([summary], [r for r in recs if r["world_size"] == 2 and r["strategy"] == "ddp"], "weak")
    assert [(t["name"], t["x"]) for t in none["traces"]] == [("ddp 16/rank", [2]), ("ideal", [2])]


def test_throughput_per_strategy_and_batch(loaded):
    recs, _ = loaded
    ch = charts.throughput(recs)
    assert [(t["name"], t["x"], t["y"]) for t in ch["traces"]] == [
        ("ddp b16", [1, 2], [6400.0, 9280.0]),       # x2: median(150 x 64, 140 x 64) over the two LR rules
        ("ddp b32", [2], [11200.0]),                 # median(180 x 64, 170 x 64)
        ("fsdp b16", [1, 2], [5760.0, 9216.0]),
        ("single b16", [1], [64000.0])]              # the failed zero2 run has none


def test_memory_stacked_per_rank(loaded):
    recs, _ = loaded
    ch = charts.memory(sort_records(recs, None))
    assert ch["barmode"] == "stack"
    assert [t["name"] for t in ch["traces"]] == ["params", "grads", "optimizer state", "activations + runtime"]
    assert ch["traces"][0]["x"] == ["fx/0 r0", "fx/1 r0", "fx/1 r1", "fx/8 r0"]
    assert [t["y"] for t in ch["traces"]] == [
        [1.0, 1.0, 1.0, 4.0], [1.0, 1.0, 1.0, 4.0], [2.0, 2.0, 2.0, 8.0],
        [96.0, 86.0, 76.0, 1008.0]]   # RSS 100/90/80 MiB - 4; GPU: device 1024 MiB - 16 (not its 5000 MiB RSS)
    assert "peak device 1024.0 MiB" in ch["traces"][0]["text"][3]
    assert ch["notes"] == ["not shown, no per-rank model-state breakdown in run.json: fx/3, fx/2, fx/4, fx/5, fx/6"]


def test_loss_curves_with_lr(loaded):
    recs, _ = loaded
    ch = charts.loss_curves(sort_records(recs, None))
    assert len(ch["traces"]) == 8                              # every completed run, not the failed one
    t4 = next(t for t in ch["traces"] if t["name"].startswith("fx/4 "))
    assert t4 == {"name": "fx/4 ddp x2 b32 lr 0.002->0.0002", "x": [1, 2], "y": [5.0, 2.5], "strategy": "ddp"}
    assert ch["traces"][0]["name"] == "fx/0 ddp x1 b16 lr 0.001"


def test_batch_size_x_lr_rule_against_final_loss(loaded):
    recs, _ = loaded
    ch = charts.lr_scaling(recs)
    assert [(t["name"], t["x"], t["y"], t["text"]) for t in ch["traces"]] == [
        ("lr_rule=linear", [16, 32], [3.1, 2.5], ["lr 0.001", "lr 0.002"]),
        # b16: median(3.2, 3.0, 3.3, 3.1, 3.4) = 3.2 (ddp x1, x2, fsdp x1, x2, single)
        ("lr_rule=none", [16, 32], [3.2, 2.9], ["lr 0.001", "lr 0.001"])]


def test_breakdown_per_rank(loaded):
    recs, _ = loaded
    ch = charts.breakdown(sort_records(recs, None))
    assert [(t["name"], t["x"]) for t in ch["traces"]] == [(n, ["fx/1 r0", "fx/1 r1", "fx/6 r0", "fx/6 r1"])
                                                           for n in ("compute", "transfer", "wait")]
    assert [t["y"] for t in ch["traces"]] == [pytest.approx(v) for v in (
        [10.0, 9.0, 20.0, 18.0], [2.0, 2.0, 4.0, 4.0], [0.0, 1.0, 0.0, 2.0])]


def test_planner_predictions_from_each_runs_own_profile(loaded):
    from scalelab.plan.run_records import terms_from_run
    from scalelab.plan.hardware import load_hardware
    from scalelab.plan.peak_memory import device_total_bytes
    from scalelab.plan.step_time import step_time

    recs, _ = loaded
    step, mem = charts.planner(sort_records(recs, None))
    gpu = next(r for r in recs if r["job"]["name"] == "fx/8")
    terms, hw = terms_from_run(gpu), load_hardware("h200")
    assert [(t["name"], t["x"]) for t in step["traces"]] == [("measured", ["fx/8"]), ("predicted", ["fx/8"])]
    assert step["traces"][0]["y"] == [pytest.approx(50.0)]
    assert step["traces"][1]["y"] == [pytest.approx(step_time(terms, hw)["step_s"] * 1e3)]   # no host probe on GPU
    assert mem["traces"][0]["y"] == [1024.0]                                                # device, not RSS
    assert mem["traces"][1]["y"] == [pytest.approx(device_total_bytes(terms, hw) / MIB)]
    assert step["notes"][1:] == [   # this_cpu is never probed by a report; PlanError; the failed run not listed
        "not predicted, this host's CPU profile is not probed yet (a run here probes it): fx/0, fx/1, fx/3, fx/2, "
        "fx/4, fx/6",
        "not predicted, run.json model lacks n_params/n_layers/d_model: {'name': 'gpt_nano'}: fx/5"]


def test_failed_runs_listed_with_errors(loaded):
    assert charts.failed(loaded[0]) == [{"job": "fx/7", "strategy": "zero2", "world_size": 2, "status": "failed",
                                         "error": "RuntimeError: out of memory (rank 1)"}]


def test_html_is_self_contained(loaded):
    import re

    from scalelab.results.report import render_html

    recs, summary = loaded
    page = render_html(sort_records(recs, None), [summary])
    assert "Content-Security-Policy" in page and "default-src 'none'" in page
    assert not re.search(r"<(script|link|img|iframe)[^>]+(src|href)\s*=\s*[\"']?(https?:)?//", page, re.I)
    assert page.count("<script") == 3 and "Plotly" in page
    for cid in ("efficiency_strong", "efficiency_weak", "throughput", "memory", "loss", "lr_scaling", "breakdown",
                "planner_step", "planner_memory"):
        assert f'id="{cid}"' in page
    assert 'class=failed title="RuntimeError: out of memory (rank 1)"' in page
    assert "config.lr_scaling.rule" in page and "config.logger.api_token" in page and "&lt;redacted&gt;" in page


def test_every_sweep_summary_writes_its_report(sweep):
    """The sweep-end callback (also `scalelab aggregate`) writes SWEEP_DIR/report.html and prints its path."""
    proc = subprocess.run([sys.executable, "-m", "scalelab.cli", "aggregate", str(sweep)], capture_output=True,
                          text=True)
    assert proc.returncode == 0, proc.stderr
    assert f"report: {sweep / 'report.html'}" in proc.stdout.splitlines()
    page = (sweep / "report.html").read_text()
    assert page.startswith("<!doctype html>") and 'id="efficiency_strong"' in page and "fx/7" in page


def test_model_and_precision_columns_only_where_runs_differ(loaded):
    """Runs of two models side by side were told apart only by a 20x throughput gap (walkthrough)."""
    recs, _ = loaded
    same = [r for r in recs if r["job"]["name"] != "fx/8"]          # one precision, no second model
    heads = render(same, "markdown").splitlines()[0]
    assert "| model |" not in heads and "| precision |" not in heads
    small = {**recs[0], "model": {"name": "gpt_small"}, "job": {"name": "fx/9"}}
    heads = render([*same, small], "markdown").splitlines()[0]
    assert heads.startswith("| job | model | strategy |") and "| precision |" not in heads
    rows = render([*same, small], "markdown").splitlines()
    assert any(r.startswith("| fx/9 | gpt_small | ddp |") for r in rows)
    assert "| precision |" in render(recs, "markdown").splitlines()[0]      # fx/8 is bf16-mixed
    plain = render([*same, small], "table").splitlines()[:-1]                # identity columns: left (no note)
    col = plain[0].index("strategy")
    assert all(row[col:].split()[0] in ("ddp", "fsdp", "zero2") for row in plain[2:])
    assert "| precision |" not in render([*same, {**small, "precision": "32"}], "markdown")  # "32" is 32-true

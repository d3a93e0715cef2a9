"""Review findings on sweep aggregation: keys that change nothing a run measures (launcher=torchrun's
per-job rdzv_id, where its logs go) split no scaling group; lr_scaling.base_batch_size splits one
only where a scaling rule uses it; a short run above its baseline is marked in sweep.json, the
table and the chart; repeats at one world size keep their own W&B keys and one chart point; the
summary's sweep_dir is absolute; a job that failed after rank 0 recorded it keeps the figures.
Expected efficiencies by hand: thr(N) / (N/N0 x thr(N0))."""
import json
import os
import time
from pathlib import Path
from types import SimpleNamespace

import pytest

from scalelab.results.charts import efficiency as efficiency_chart
from scalelab.results.sweep import aggregate, attach_efficiency
from scalelab.results.table import render
from scalelab.results.wandb_summary import efficiency_keys

from .test_results import _rec
from .test_scaling_groups import _write


def _torchrun(job, world, thr, rdzv_id):
    r = _rec(job, "ddp", world, 16, thr)
    r["config"]["launcher"] = {"name": "torchrun", "rdzv_endpoint": "127.0.0.1:29531", "rdzv_id": rdzv_id}
    r["config"]["logger"] = {"name": "wandb", "mode": "offline", "project": job.replace("/", "-")}
    return r


def test_a_torchrun_sweep_is_one_group_whatever_its_per_job_keys(tmp_path):
    _write(tmp_path, [_torchrun("t/0", 1, 378.36, "scalelab-2ad58eb99cfd"),
                      _torchrun("t/1", 2, 286.88, "scalelab-6723cd8abee8")])
    (group,) = [g for g in aggregate(tmp_path)["groups"] if g["kind"] == "strong"]
    eff = {m["job"]: m["scaling_efficiency"] for m in group["runs"]}
    assert eff == pytest.approx({"t/0": 1.0, "t/1": 286.88 / (2 * 378.36)})    # 0.379; no group before


def test_how_ranks_are_bound_still_splits_a_group(tmp_path):
    """launcher.extra_args (srun's --cpu-bind) changes the speed: its runs are another series (100 /
    (2 x 55) = 0.909, not 1.25 against the unbound baseline)."""
    runs = [_torchrun(f"b/{i}", w, thr, f"id{i}") for i, (w, thr) in enumerate(((1, 40.0), (1, 55.0), (2, 60.0),
                                                                                (2, 100.0)))]
    for r in (runs[1], runs[3]):
        r["config"]["launcher"]["extra_args"] = ["--cpu-bind=cores"]
    _write(tmp_path, runs)
    eff = {m["job"]: m["scaling_efficiency"] for g in aggregate(tmp_path)["groups"] for m in g["runs"]}
    assert eff == pytest.approx({"b/0": 1.0, "b/2": 60 / 80, "b/1": 1.0, "b/3": 100 / 110})


def test_base_batch_size_splits_a_group_only_under_a_scaling_rule(tmp_path):
    runs = [_rec("l/0", "ddp", 1, 16, 40.0, lr_rule="linear"), _rec("l/1", "ddp", 2, 16, 38.0, lr_rule="linear"),
            _rec("l/2", "ddp", 2, 16, 50.0, lr_rule="linear")]
    runs[0]["config"]["lr_scaling"]["base_batch_size"] = runs[1]["config"]["lr_scaling"]["base_batch_size"] = 16
    runs[2]["config"]["lr_scaling"]["base_batch_size"] = 32            # another LR: another series
    _write(tmp_path, runs)
    (group,) = [g for g in aggregate(tmp_path)["groups"] if g["kind"] == "strong"]
    assert {m["job"]: m["scaling_efficiency"] for m in group["runs"]} == pytest.approx({"l/0": 1.0, "l/1": 38 / 80})
    # rule none: base_batch_size follows the global batch (conf/lr_scaling/none.yaml), a weak series
    weak = [_rec("w/0", "ddp", 1, 16, 40.0), _rec("w/1", "ddp", 2, 32, 72.0)]
    (tmp_path / "weak").mkdir()
    _write(tmp_path / "weak", weak)
    (group,) = [g for g in aggregate(tmp_path / "weak")["groups"] if g["kind"] == "weak"]
    assert {m["job"]: m["scaling_efficiency"] for m in group["runs"]} == pytest.approx({"w/0": 1.0, "w/1": 0.9})


def test_a_short_run_above_the_baseline_is_marked(tmp_path):
    runs = [_rec("s/0", "ddp", 1, 16, 20.0), _rec("s/1", "ddp", 2, 16, 44.0)]
    runs[1]["short_run"] = True
    _write(tmp_path, runs)
    summary = aggregate(tmp_path)
    (group,) = [g for g in summary["groups"] if g["kind"] == "strong"]
    assert [(m["scaling_efficiency"], m["short_run"]) for m in group["runs"]] == [(1.0, False), (pytest.approx(1.1),
                                                                                                 True)]
    assert not group["baseline_short_run"]
    records = [json.loads((tmp_path / d / "run.json").read_text()) | {"job": {"name": n, "record_path": str(
        tmp_path / d / "run.json")}} for d, n in (("0", "s/0"), ("1", "s/1"))]
    attach_efficiency(records, summary)
    rows = {line.split()[0]: line for line in render(records).splitlines()[2:]}
    assert "1.10*" in rows["s/1"] and "1.00*" not in rows["s/0"]
    # its throughput is the few steps' too: marked where a sort by samples/s or tokens/s ranks it
    table = render(records, "markdown").splitlines()
    col = [c.strip() for c in table[0].split("|")].index("samples/s")
    assert [[c.strip() for c in line.split("|")][col] for line in table[2:4]] == ["20.0", "44.0*"]
    # and its step times (median and p90 100 ms in each record): the p90 of 3 steps is their max (review)
    for head, cell in (("step ms (med)", "100.0"), ("step ms (p90)", "100.0")):
        col = [c.strip() for c in table[0].split("|")].index(head)
        assert [[c.strip() for c in line.split("|")][col] for line in table[2:4]] == [cell, cell + "*"], head
    chart = efficiency_chart([summary], records, "strong")
    assert any(n.startswith("short runs (fewer than 5 measured steps)") and n.endswith("s/1") for n in chart["notes"])


def test_repeats_at_one_world_keep_their_keys_and_one_chart_point(tmp_path):
    """Two runs per world size that differ only in where their logs go (logger.project): one group,
    one point per world size on the chart (their median), a W&B key each."""
    runs = [_torchrun(f"r/{i}", w, thr, f"id{i}") for i, (w, thr) in enumerate(((1, 40.0), (1, 40.0), (2, 60.0),
                                                                                (2, 70.0)))]
    _write(tmp_path, runs)
    summary = aggregate(tmp_path)
    (group,) = [g for g in summary["groups"] if g["kind"] == "strong"]
    assert [m["scaling_efficiency"] for m in group["runs"]] == pytest.approx([1.0, 1.0, 0.75, 0.875])
    keys = efficiency_keys(summary["groups"])
    assert keys == pytest.approx({"efficiency/strong/ddp/x1/b16/job=r/0": 1.0, "efficiency/strong/ddp/x1/b16/job=r/1": 1.0,
                                  "efficiency/strong/ddp/x2/b16/job=r/2": 0.75,
                                  "efficiency/strong/ddp/x2/b16/job=r/3": 0.875})
    records = [json.loads((tmp_path / str(i) / "run.json").read_text()) for i in range(4)]
    for i, r in enumerate(records):
        r["job"]["record_path"] = str(tmp_path / str(i) / "run.json")
    line = next(t for t in efficiency_chart([summary], records, "strong")["traces"] if t["name"] != "ideal")
    assert (line["x"], line["y"]) == ([1, 2], pytest.approx([1.0, (0.75 + 0.875) / 2]))


def test_the_baseline_is_the_median_of_its_repeats(tmp_path):
    """logger=none,csv at devices 1,2 (review, sweep D): 533.5 and 445.0 samples/s on 1 rank, 672.7 and
    464.9 on 2. Against the first folder's run alone, the second 1-rank run read 0.83 and the chart's
    line started at 0.917; against their median, 489.25: 533.5 / 489.25 = 1.090, 445 / 489.25 = 0.910,
    672.7 / 978.5 = 0.687, 464.9 / 978.5 = 0.475, and the chart's points are 1.0 and 0.581."""
    runs = [_torchrun(f"d/{i}", w, thr, f"id{i}") for i, (w, thr) in enumerate(((1, 533.5), (1, 445.0), (2, 672.7),
                                                                                (2, 464.9)))]
    _write(tmp_path, runs)
    summary = aggregate(tmp_path)
    (group,) = [g for g in summary["groups"] if g["kind"] == "strong"]
    assert (group["baseline_samples_per_s"], group["baseline_repeats"]) == (pytest.approx(489.25), 2)
    assert [m["scaling_efficiency"] for m in group["runs"]] == pytest.approx([1.0904, 0.9096, 0.6875, 0.4751],
                                                                              abs=1e-4)
    records = [json.loads((tmp_path / str(i) / "run.json").read_text()) for i in range(4)]
    for i, r in enumerate(records):
        r["job"]["record_path"] = str(tmp_path / str(i) / "run.json")
    line = next(t for t in efficiency_chart([summary], records, "strong")["traces"] if t["name"] != "ideal")
    assert (line["x"], line["y"]) == ([1, 2], pytest.approx([1.0, 0.5813], abs=1e-4))


def test_the_summary_s_sweep_dir_is_absolute(tmp_path, monkeypatch):
    _write(tmp_path, [_rec("a/0", "ddp", 1, 16, 10.0), _rec("a/1", "ddp", 2, 16, 15.0)])
    monkeypatch.chdir(tmp_path.parent)
    summary = aggregate(Path(tmp_path.name))
    assert summary["sweep_dir"] == str(tmp_path.resolve())
    assert json.loads((tmp_path / "sweep.json").read_text())["sweep_dir"] == str(tmp_path.resolve())


def _spec():
    run = SimpleNamespace(world_size=2, model_arch=None, accelerator="cpu", devices_per_node=2, num_nodes=1)
    return SimpleNamespace(batch=SimpleNamespace(global_batch_size=16, micro_batch_size=8, accumulate=1), lr=0.1,
                           run=run, plan=SimpleNamespace(parallel_degrees=lambda w: {"dp": w}))


def test_a_job_that_failed_after_its_record_keeps_the_figures(tmp_path, monkeypatch):
    from scalelab import job_outcome

    monkeypatch.setattr(job_outcome, "base_record", lambda *a, **k: {"status": None, "figures": "none"})
    (tmp_path / "ranks.log").write_text("[scalelab] rank 1 failed first (exit code 1)\n")
    since = time.time() - 5
    (tmp_path / "run.json").write_text(json.dumps({"status": "completed", "throughput": {"samples_per_s": 12.5}}))
    rec = job_outcome.collect(tmp_path, 1, {}, _spec(), 1, since=since)
    assert (rec["status"], rec["throughput"], rec["failed_after_record"]) == ("failed", {"samples_per_s": 12.5}, True)
    assert rec["error"].startswith("rank 1 failed first (exit code 1)") and rec["returncode"] == 1
    # a record from before this attempt's ranks started is not this attempt's: a bare failed record
    os.utime(tmp_path / "run.json", (since - 60, since - 60))
    rec = job_outcome.collect(tmp_path, 1, {}, _spec(), 1, since=since)
    assert rec["status"] == "failed" and "throughput" not in rec and "failed_after_record" not in rec


def test_a_weak_scaling_sweep_is_one_throughput_line():
    """16 a rank at 1, 2, 4 devices (global batch 16, 32, 64): one line per per-rank batch (each
    global batch was a line of one point); a strong series beside it keeps its global batch."""
    from scalelab.results.charts import throughput

    weak = [_rec(f"w/{i}", "ddp", w, 16 * w, thr) for i, (w, thr) in enumerate(((1, 40.0), (2, 72.0), (4, 128.0)))]
    strong = [_rec(f"s/{i}", "fsdp", w, 32, thr) for i, (w, thr) in enumerate(((1, 30.0), (2, 50.0)))]
    traces = {t["name"]: (t["x"], t["y"]) for t in throughput([*weak, *strong])["traces"]}
    assert traces == {"ddp 16/rank": ([1, 2, 4], [40.0, 72.0, 128.0]), "fsdp b32": ([1, 2], [30.0, 50.0])}


def test_a_sweep_copied_aside_and_run_again_is_two_throughput_lines(tmp_path):
    """`compare a_old a` after a rerun into `a`: the copies' records still say sweep_dir a, and the
    throughput chart drew one line of both sweeps' medians (41590 tokens/s: no run's figure)."""
    import shutil

    from scalelab.results.charts import throughput
    from scalelab.results.record import read_records

    def sweep(root, thr):
        root.mkdir()
        (root / "multirun.yaml").write_text("{}\n")
        runs = [_rec(f"a/{i}", "ddp", w, 16, t) for i, (w, t) in enumerate(zip((1, 2), thr))]
        for i, r in enumerate(runs):
            r["job"].update(sweep_dir=str(tmp_path / "a"), dir=str(tmp_path / "a" / str(i)))
        _write(root, runs)

    sweep(tmp_path / "a", (40.0, 60.0))
    shutil.move(tmp_path / "a", tmp_path / "a_old")
    sweep(tmp_path / "a", (30.0, 50.0))
    traces = {t["name"]: t["y"] for t in throughput(read_records([tmp_path / "a_old", tmp_path / "a"]))["traces"]}
    assert traces == {"a_old: ddp b16": [40.0, 60.0], "a: ddp b16": [30.0, 50.0]}


def test_group_by_a_key_some_runs_lack_is_null_in_json():
    from scalelab.results.table import render

    runs = [_rec("g/0", "ddp", 1, 16, 1.0), _rec("g/1", "ddp", 2, 16, 1.0)]
    runs[0]["breakdown"] = {"comm_fraction": 0.25}
    doc = json.loads(render(runs, "json", group_by="breakdown.comm_fraction"))
    assert [g["value"] for g in doc["groups"]] == [0.25, None]      # was "<object object at 0x...>"


def test_the_planner_chart_leaves_a_short_run_out_as_plan_validate_does():
    from scalelab.results.charts import predictions

    run = _rec("p/0", "ddp", 1, 16, 1.0) | {"short_run": True, "mfu": {"hardware_profile": "h100_sxm"}}
    rows, skipped = predictions([run])
    assert rows == [] and skipped == [("p/0", "short run (fewer than 5 measured steps): not a steady-state step time")]


def test_empty_compare_options_are_one_line(tmp_path):
    import subprocess
    import sys

    _write(tmp_path, [_rec("e/0", "ddp", 1, 16, 1.0)])
    for opt, want in (("--sort=", "error: --sort needs a key"), ("--group-by=", "error: --group-by needs a key"),
                      ("--where==3", "error: --where '=3': expected KEY=VALUE")):   # the first two were ignored
        proc = subprocess.run([sys.executable, "-m", "scalelab.cli", "compare", str(tmp_path), opt],
                              capture_output=True, text=True, timeout=120)
        assert proc.returncode == 2 and proc.stderr.startswith(want) and proc.stderr.count("\n") == 1, proc.stderr


def test_a_markdown_cell_escapes_html():
    from scalelab.results.table import render

    bad = _rec("m/0", "ddp", 1, 16, 0.0, status="failed")
    bad["error"] = "File \"x.py\", in <module>: a | b"
    row = render([bad], "markdown").splitlines()[2]
    assert "in &lt;module&gt;: a \\| b" in row and "<module>" not in row


def test_seven_series_of_one_strategy_are_drawn_apart():
    from scalelab.results import report
    from scalelab.results.chart_base import chart

    ch = chart("t", "T", "x", "y", [{"name": f"ddp {i}", "x": [1, 2], "y": [1, 2], "strategy": "ddp"} for i in range(12)])
    styles = [(d["line"]["dash"], d["marker"]["symbol"]) for d in report.figure(ch)["data"]]
    assert len(set(styles)) == 12        # the 7th was drawn as the 1st (same colour, dash and marker)


def test_csv_columns_keep_their_place_whatever_the_sort():
    from scalelab.results.table import render

    a, b = _rec("c/0", "ddp", 1, 16, 10.0), _rec("c/1", "fsdp", 2, 16, 20.0)
    b["short_run"] = True                                   # a key only the second run has: its column
    heads = {s: render([a, b], "csv", sort=s).splitlines()[0] for s in (None, "-throughput.samples_per_s")}
    assert heads[None] == heads["-throughput.samples_per_s"]
    import csv

    head, *rows = csv.reader(render([a, b], "csv").splitlines())
    assert [r[head.index("short_run")] for r in rows] == ["", "true"]             # was Python's True


def test_an_efficiency_line_is_named_by_a_group_by_value_its_runs_share(tmp_path):
    runs = [_rec(f"q/{i}", "ddp", w, 16, thr) for i, (w, thr) in enumerate(((1, 40.0), (2, 60.0)))]
    _write(tmp_path, runs)
    summary = aggregate(tmp_path)
    records = [json.loads((tmp_path / str(i) / "run.json").read_text()) for i in range(2)]
    for i, r in enumerate(records):
        r["job"]["record_path"] = str(tmp_path / str(i) / "run.json")
    names = lambda key: [t["name"] for t in efficiency_chart([summary], records, "strong", group_by=key)["traces"]]  # noqa: E731
    assert names("world_size") == ["ddp b16", "ideal"]                  # was "ddp b16 [world_size=1]"
    assert names("global_batch_size") == ["ddp b16 [global_batch_size=16]", "ideal"]


def test_a_runs_weak_efficiency_is_on_its_record_beside_the_strong_one(tmp_path):
    """ddp at 1, 2 ranks x global batch 16, 32: every run is in a strong group, so the weak figure
    (2 ranks at 32 against 1 at 16, per-rank 16) was in sweep.json only. By hand: strong b16 150 /
    (2 x 100) = 0.75, strong b32 160 / (2 x 120) = 0.667, weak 160 / (2 x 100) = 0.8."""
    runs = [_rec("e/0", "ddp", 1, 16, 100.0), _rec("e/1", "ddp", 1, 32, 120.0), _rec("e/2", "ddp", 2, 16, 150.0),
            _rec("e/3", "ddp", 2, 32, 160.0)]
    _write(tmp_path, runs)
    summary = aggregate(tmp_path)
    records = [json.loads((tmp_path / str(i) / "run.json").read_text()) for i in range(4)]
    for i, r in enumerate(records):
        r["job"]["record_path"] = str(tmp_path / str(i) / "run.json")
    attach_efficiency(records, summary)
    got = {r["job"]["name"]: (r["scaling_efficiency"], r.get("weak_scaling_efficiency")) for r in records}
    assert got == {"e/0": (1.0, 1.0), "e/1": (1.0, None), "e/2": (0.75, None),
                   "e/3": (pytest.approx(160 / 240), pytest.approx(0.8))}


def test_the_mfu_profile_splits_no_group(tmp_path):
    # hardware= only sets the peak MFU is divided by: runs that differ in it measured the same thing
    a, b = _rec("h/0", "ddp", 1, 16, 100.0), _rec("h/1", "ddp", 2, 16, 150.0)
    a["config"].update(hardware={"name": "h100_sxm", "peak_flops": {"bf16": 9.89e14}}, hardware_profile="h100_sxm")
    b["config"].update(hardware=None, hardware_profile="auto")
    _write(tmp_path, [a, b])
    (group,) = [g for g in aggregate(tmp_path)["groups"] if g["kind"] == "strong"]
    assert {m["job"]: m["scaling_efficiency"] for m in group["runs"]} == pytest.approx({"h/0": 1.0, "h/1": 0.75})


def test_the_logger_is_a_measured_setting_its_project_is_not(tmp_path):
    """logger=none,csv at devices 1,2 (review, 2026-12-03): csv's per-step save is in the step time
    (671.5 vs 543.5 samples/s on 1 rank, 19 % apart), and the two were pooled as repeats of one
    baseline (607.5: 1.105 and 0.895 on 1 rank). Each logger is its own series: 2-rank 900 / (2 x
    671.5) = 0.670 for none, 800 / (2 x 543.5) = 0.736 for csv; W&B's project splits nothing."""
    runs = [_torchrun(f"g/{i}", w, thr, f"id{i}") for i, (w, thr) in enumerate(((1, 671.5), (1, 543.5), (2, 900.0),
                                                                                (2, 800.0)))]
    for r in (runs[0], runs[2]):
        r["config"]["logger"] = {"name": "none"}
    for r in (runs[1], runs[3]):
        r["config"]["logger"] = {"name": "csv"}
    _write(tmp_path, runs)
    strong = [g for g in aggregate(tmp_path)["groups"] if g["kind"] == "strong"]
    eff = {m["job"]: m["scaling_efficiency"] for g in strong for m in g["runs"]}
    assert len(strong) == 2 and all(g["baseline_repeats"] == 1 for g in strong)
    assert eff == pytest.approx({"g/0": 1.0, "g/2": 900 / (2 * 671.5), "g/1": 1.0, "g/3": 800 / (2 * 543.5)})
    keys = efficiency_keys(aggregate(tmp_path)["groups"])
    assert len([k for k in keys if "/x2/" in k]) == 2, keys    # two series, two keys at 2 ranks
    # W&B's project and tags are where it logs, not what is measured: one series
    projects = [_torchrun(f"p/{i}", w, thr, f"id{i}") for i, (w, thr) in enumerate(((1, 600.0), (2, 900.0)))]
    projects[1]["config"]["logger"].update(project="other", tags=["x"])
    other = tmp_path / "projects"
    other.mkdir()
    _write(other, projects)
    (group,) = [g for g in aggregate(other)["groups"] if g["kind"] == "strong"]
    assert {m["job"]: m["scaling_efficiency"] for m in group["runs"]} == pytest.approx({"p/0": 1.0, "p/1": 0.75})

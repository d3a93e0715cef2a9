"""Results-path review fixes, on hand-made run records (expected figures worked out by hand):
- a diverged run's NaN / inf is written as null (strict JSON: jq, JSON.parse), in run.json and in
  `compare --format json`, and a null loss reads "nan" in the table and "diverged" in the LR chart;
- null mfu.value / comm_fraction / per-rank memory entries show "-" and are no chart point (crashed);
- records without a config block, or of another accelerator, never share a scaling baseline;
- a renamed sweep folder (multirun.yaml, each job where the sweep had it) keeps its efficiency;
- an mlp sweep (no tokens) charts samples/s."""
from __future__ import annotations

import json
import shutil

import pytest

from scalelab.cli import main
from scalelab.results import charts
from scalelab.results.record import load_record, write_json
from scalelab.results.sweep import aggregate
from scalelab.results.table import render

from .test_compare_sweeps import _eff, _run
from .test_report import MIB, _rec, _states


def _strict(text: str):
    """json.loads that refuses NaN / Infinity, as jq and JavaScript's JSON.parse do."""
    def refuse(name):
        raise ValueError(f"{name} is not JSON")
    return json.loads(text, parse_constant=refuse)


def _diverged():
    nan = float("nan")
    return _rec(1, "ddp", 2, 16, 150.0, final=nan, loss={"first": 5.0, "final": nan,
                                                          "curve": [[1, 5.0], [2, float("inf")], [3, nan]]})


# ---- 1: non-finite floats are null ---------------------------------------------------------------
def test_run_json_of_a_diverged_run_is_strict_json(tmp_path):
    write_json(tmp_path / "run.json", _diverged())
    rec = _strict((tmp_path / "run.json").read_text())     # before: "final": NaN, "Infinity" in the curve
    assert rec["loss"] == {"first": 5.0, "final": None, "curve": [[1, 5.0], [2, None], [3, None]]}
    assert load_record(tmp_path / "run.json")["loss"]["final"] is None


def test_compare_json_is_strict_json():
    runs = _strict(render([_rec(0, "ddp", 1, 16, 100.0), _diverged()], "json"))
    assert [r["loss"]["final"] for r in runs] == [3.0, None]
    grouped = _strict(render([_diverged()], "json", group_by="strategy"))
    assert grouped["groups"][0]["runs"][0]["loss"]["curve"] == [[1, 5.0], [2, None], [3, None]]


def test_a_null_loss_reads_nan_where_the_run_diverged_and_dash_where_unmeasured(tmp_path):
    (tmp_path / "a").mkdir()
    write_json(tmp_path / "a" / "run.json", _diverged())
    rec = load_record(tmp_path / "a" / "run.json")
    unmeasured = _rec(2, "ddp", 1, 16, 100.0, loss={"first": None, "final": None, "curve": []})
    lines = render([rec, unmeasured], "markdown").splitlines()
    heads = [h.strip() for h in lines[0].split("|")]
    cells = {line.split("|")[1].strip(): [c.strip() for c in line.split("|")] for line in lines[2:]}
    assert cells["fx/1"][heads.index("loss final")] == "nan"
    assert cells["fx/2"][heads.index("loss final")] == "-"


def test_lr_chart_counts_a_null_final_loss_with_a_curve_as_diverged(tmp_path):
    (tmp_path / "r").mkdir()
    write_json(tmp_path / "r" / "run.json", _diverged())
    runs = [load_record(tmp_path / "r" / "run.json"), _rec(0, "ddp", 1, 16, 100.0, final=3.0)]
    trace, = charts.lr_scaling(runs)["traces"]
    assert trace["x"] == [16] and trace["y"] == [3.0]
    assert trace["text"] == ["lr 0.001; 1 of 2 diverged (NaN/inf loss, not in the median)"]   # before: the run was dropped
    null = _rec(1, "ddp", 2, 16, 150.0, loss={"first": 5.0, "final": None, "curve": [[1, 5.0], [2, None]]})
    assert charts.lr_scaling([null, runs[1]])["traces"][0]["text"] == trace["text"]   # the record as written
    loss = {t["name"].split()[0]: t for t in charts.loss_curves(runs)["traces"]}
    assert loss["fx/1"]["x"] == [1] and loss["fx/1"]["y"] == [5.0]                # null points left out


# ---- 2: null fields ------------------------------------------------------------------------------
def _nulls():
    rec = _rec(1, "ddp", 2, 16, 150.0, mfu={"value": None, "hardware_profile": "this_cpu"},
               breakdown={"comm_fraction": None, "per_rank": [None]})
    rec["memory"]["peak_device_bytes_per_rank"] = [None, 3 * MIB]
    return rec


def test_null_mfu_comm_and_device_entries_show_a_dash_or_the_figure():
    lines = render([_rec(0, "ddp", 1, 16, 100.0, breakdown={"comm_fraction": 0.25}), _nulls()],
                   "markdown").splitlines()
    heads = [h.strip() for h in lines[0].split("|")]
    rows = {line.split("|")[1].strip(): [c.strip() for c in line.split("|")] for line in lines[2:]}
    got = {job: [row[heads.index(h)] for h in ("MFU %", "comm %", "device MiB/rank")] for job, row in rows.items()}
    assert got == {"fx/0": ["10.0", "25", "-"], "fx/1": ["-", "-", "3"]}    # before: TypeError


def test_charts_leave_out_null_memory_entries():
    ok = _rec(0, "ddp", 1, 16, 100.0)
    ok["memory"]["model_state_breakdown_per_rank"] = _states(1, 1, 2, 1)
    bad = _nulls()
    bad["memory"]["model_state_breakdown_per_rank"] = _states(1, 1, 2, 2)
    mem = charts.memory([ok, bad])                                    # before: None / MIB, TypeError
    assert mem["traces"][0]["x"] == ["fx/0 r0"]
    assert any("fx/1" in n and "null" in n for n in mem["notes"])
    assert charts.breakdown([bad])["traces"][0]["y"] == [0.0]        # a null per-rank entry: nothing measured
    assert render([ok, bad], "html")                                   # the dashboard renders


# ---- 3: grouping without a config block / across accelerators -----------------------------------
def _folder(root, recs):
    root.mkdir(parents=True)
    for i, rec in enumerate(recs):
        (root / str(i)).mkdir()
        write_json(root / str(i) / "run.json", rec)
    return root


def _effs(summary) -> dict:
    return {(g["kind"], run["dir"]): pytest.approx(run["scaling_efficiency"]) for g in summary["groups"]
            for run in g["runs"]}


def test_records_without_config_are_grouped_by_strategy(tmp_path):
    recs = [_rec(0, "ddp", 1, 16, 100.0), _rec(1, "ddp", 2, 16, 150.0),
            _rec(2, "single", 1, 16, 400.0), _rec(3, "single", 2, 16, 200.0)]
    for r in recs:
        r.pop("config")
    summary = aggregate(_folder(tmp_path / "sw", recs), write=False)
    # ddp: 150 / (2 x 100) = 0.75; single: 200 / (2 x 400) = 0.25. Before: one group, one baseline (ddp x1)
    assert _effs(summary) == {("strong", "0"): 1.0, ("strong", "1"): 0.75, ("strong", "2"): 1.0, ("strong", "3"): 0.25}
    assert sorted(g["strategy"] for g in summary["groups"]) == ["ddp", "single"]


def test_runs_on_another_accelerator_get_no_shared_baseline(tmp_path):
    gpu = _rec(2, "ddp", 2, 16, 800.0, hardware={"accelerator": "cuda"})
    summary = aggregate(_folder(tmp_path / "sw", [_rec(0, "ddp", 1, 16, 100.0), _rec(1, "ddp", 2, 16, 150.0), gpu]),
                        write=False)
    assert _effs(summary) == {("strong", "0"): 1.0, ("strong", "1"): 0.75}   # before: the cuda run 4.00 vs cpu x1


# ---- 4: a renamed sweep folder -------------------------------------------------------------------
def _sweep(folder, thrs, mark=True):
    """A sweep as train.py leaves it: each job's job.dir and job.sweep_dir resolved."""
    folder.mkdir(parents=True)
    if mark:
        (folder / "multirun.yaml").write_text("hydra: {}\n")
    for i, thr in enumerate(thrs):
        (folder / str(i)).mkdir()
        write_json(folder / str(i) / "run.json", _rec(i, "ddp", i + 1, 16, thr, job={
            "name": f"{folder.name}/{i}", "group": folder.name, "dir": str((folder / str(i)).resolve()),
            "sweep_dir": str(folder.resolve()), "num": i}))
    return folder


def test_a_renamed_sweep_keeps_its_efficiency_and_aggregates(tmp_path, capsys):
    new = shutil.move(str(_sweep(tmp_path / "sw", [100.0, 150.0])), str(tmp_path / "ddp_baseline"))
    eff = _eff([new], capsys)                                            # before: None, None
    assert eff == pytest.approx({f"{new}/0/run.json": 1.0, f"{new}/1/run.json": 0.75})
    code, _, err = _run(["aggregate", new, "--wandb", "disabled"], capsys)
    assert code == 0, err                                                  # before: "is not its runs' sweep folder"
    assert [r["scaling_efficiency"] for r in _strict((tmp_path / "ddp_baseline" / "sweep.json").read_text())
            ["groups"][0]["runs"]] == pytest.approx([1.0, 0.75])


def test_a_renamed_folder_is_no_sweep_without_a_mark_or_where_the_jobs_moved(tmp_path, capsys):
    bare = shutil.move(str(_sweep(tmp_path / "sw", [100.0, 150.0], mark=False)), str(tmp_path / "bare"))
    assert set(_eff([bare], capsys).values()) == {None}
    deeper = tmp_path / "deeper"
    shutil.move(str(_sweep(tmp_path / "sw2", [100.0, 150.0])), str(deeper / "x"))
    (deeper / "multirun.yaml").write_text("hydra: {}\n")
    (deeper / "x" / "multirun.yaml").unlink()
    assert set(_eff([str(deeper)], capsys).values()) == {None}   # jobs at x/0, x/1, not 0, 1
    with pytest.raises(SystemExit) as done:
        main(["aggregate", str(deeper), "--wandb", "disabled"])
    assert done.value.code == 2


# ---- 5: an mlp sweep's throughput chart ----------------------------------------------------------
def test_throughput_chart_falls_back_to_samples_per_s():
    runs = [_rec(i, "ddp", i + 1, 16, thr) for i, thr in enumerate((100.0, 150.0))]
    for r in runs:
        r["throughput"]["tokens_per_s"] = None
    ch = charts.throughput(runs)
    assert ch["y_title"] == "samples/s"                                     # before: "tokens/s", no trace
    assert [(t["x"], t["y"]) for t in ch["traces"]] == [([1, 2], [100.0, 150.0])]
    gpt = charts.throughput([_rec(2, "ddp", 1, 16, 10.0), *runs])           # tokens where any run has them
    assert gpt["y_title"] == "tokens/s" and [t["y"] for t in gpt["traces"]] == [[640.0]]
    assert gpt["notes"] == ["not shown, no token throughput (samples/s only): fx/0, fx/1"]

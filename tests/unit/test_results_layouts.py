"""Scaling groups whose runs differ in node layout or in how long they measured (results.sweep and
the charts, table and W&B keys that show its groups). 1 node x 2 devices and 2 nodes x 1 device are
both world 2: one group, each run its own efficiency, against a baseline chosen by rule (smallest
world, a steady run before a short one, fewest nodes), never by folder order. Every expected
figure is worked out by hand: efficiency(N) = thr(N) / (N x thr(N0) / N0), tokens = 64 x samples."""
from __future__ import annotations

import pytest

from scalelab.results import charts
from scalelab.results.record import write_json
from scalelab.results.sweep import aggregate, attach_efficiency
from scalelab.results.table import render
from scalelab.results.wandb_summary import efficiency_keys

from .test_report import _rec


def _layout(num, nodes, devices, thr, **extra):
    r = _rec(num, "ddp", nodes * devices, 16, thr, num_nodes=nodes, devices_per_node=devices, **extra)
    r["config"]["trainer"].update(devices=devices, num_nodes=nodes)
    return r


def _sweep(root, runs, folders=None):
    for r, folder in zip(runs, folders or range(len(runs))):
        (root / str(folder)).mkdir(parents=True)
        write_json(root / str(folder) / "run.json", r)
    return aggregate(root, write=False)


def _demo():
    """ddp gb16: 2 nodes x 1 device at 40 samples/s, 1 x 2 at 100, 2 x 2 at 120."""
    return [_layout(0, 2, 1, 40.0), _layout(1, 1, 2, 100.0), _layout(2, 2, 2, 120.0)]


def _strong(summary):
    (g,) = [g for g in summary["groups"] if g["kind"] == "strong"]
    return g


@pytest.mark.parametrize("folders", [[0, 1, 2], [2, 1, 0]])
def test_the_baseline_is_the_intra_node_layout_whatever_the_folder_order(tmp_path, folders):
    g = _strong(_sweep(tmp_path, _demo(), folders))
    # baseline 1 x 2 (100/s): 2 x 1: 40 / (2 x 100 / 2) = 0.4; 2 x 2: 120 / (4 x 100 / 2) = 0.6
    # (was against the 2 x 1 run read first: 1.0, 2.5, 1.5)
    assert (g["baseline_job"], g["baseline_world_size"], g["baseline_num_nodes"]) == ("fx/1", 2, 1)
    assert {m["job"]: (m["num_nodes"], m["scaling_efficiency"]) for m in g["runs"]} == {
        "fx/1": (1, 1.0), "fx/0": (2, pytest.approx(0.4)), "fx/2": (2, pytest.approx(0.6))}


def test_node_layouts_of_one_world_size_are_separate_series(tmp_path):
    recs = _demo()
    summary = _sweep(tmp_path, recs)
    got = [(t["name"], t["x"], t["y"]) for t in charts.throughput(recs)["traces"]]
    # was one series "ddp b16": x2 = median(40 x 64, 100 x 64) = 4480
    assert got == [("ddp b16 1 node", [2], [6400.0]), ("ddp b16 2 nodes", [2, 4], [2560.0, 7680.0])]
    eff = charts.efficiency([summary], recs, "strong")
    assert [(t["name"], t["x"], t["y"]) for t in eff["traces"]] == [
        ("ddp b16 1 node (vs 2)", [2], [1.0]),
        ("ddp b16 2 nodes (vs 2)", [2, 4], [pytest.approx(0.4), pytest.approx(0.6)]),
        ("ideal", [2, 4], [1.0, 1.0])]


def test_a_multi_node_sweep_with_one_layout_per_world_stays_one_series(tmp_path):
    recs = [_layout(0, 1, 4, 100.0), _layout(1, 2, 4, 160.0)]
    summary = _sweep(tmp_path, recs)
    assert [(t["name"], t["x"], t["y"]) for t in charts.throughput(recs)["traces"]] == [
        ("ddp b16", [4, 8], [6400.0, 10240.0])]
    eff = charts.efficiency([summary], recs, "strong")
    # 160 / (8 x 100 / 4) = 0.8
    assert [(t["name"], t["y"]) for t in eff["traces"]] == [("ddp b16 (vs 4)", [1.0, pytest.approx(0.8)]),
                                                            ("ideal", [1.0, 1.0])]


def test_wandb_keys_of_two_layouts_do_not_collide(tmp_path):
    keys = efficiency_keys(_sweep(tmp_path, _demo())["groups"])
    # was {x2: 2.5, x4: 1.5}: the 1 x 2 run's key overwritten by the 2 x 1 run's
    assert keys == {"efficiency/strong/ddp/x2/b16": 1.0, "efficiency/strong/ddp/x2n2/b16": pytest.approx(0.4),
                    "efficiency/strong/ddp/x4n2/b16": pytest.approx(0.6)}


def _markdown(recs):
    head, _, *rows = [[c.strip() for c in line.strip("|").split("|")] for line in
                      render(recs, fmt="markdown").split("\n\n")[0].splitlines()]
    return head, {r[0]: dict(zip(head, r)) for r in rows}


def test_the_table_shows_nodes_where_a_run_spans_nodes(tmp_path):
    recs = _demo()
    attach_efficiency(recs, _sweep(tmp_path, recs))
    head, rows = _markdown(recs)
    assert head[head.index("world") + 1] == "nodes"
    assert {j: (r["world"], r["nodes"], r["efficiency"]) for j, r in rows.items()} == {
        "fx/0": ("2", "2", "0.40 (vs 2)"), "fx/1": ("2", "1", "1.00 (vs 2)"), "fx/2": ("4", "2", "0.60 (vs 2)")}
    assert "nodes" not in _markdown([_rec(0, "ddp", 2, 16, 1.0)])[0]


def test_a_missing_1_device_run_is_named_in_the_efficiency_line(tmp_path):
    recs = [_rec(0, "ddp", 1, 16, None, status="failed"), _rec(1, "ddp", 2, 16, 90.0), _rec(2, "ddp", 4, 16, 170.0)]
    eff = charts.efficiency([_sweep(tmp_path, recs)], recs, "strong")
    # 170 / (4 x 90 / 2) = 0.944...: the line starts at (2, 1.0) because 2 is its baseline
    assert [(t["name"], t["x"], t["y"]) for t in eff["traces"]] == [
        ("ddp b16 (vs 2)", [2, 4], [1.0, pytest.approx(170 / 180)]), ("ideal", [2, 4], [1.0, 1.0])]


def test_a_short_run_is_not_the_baseline_where_a_steady_one_is(tmp_path):
    short = _rec(0, "ddp", 1, 16, 300.0, short_run=True)        # 3 measured steps: an inflated figure
    recs = [short, _rec(1, "ddp", 1, 16, 100.0, short_run=False), _rec(2, "ddp", 2, 16, 150.0)]
    g = _strong(_sweep(tmp_path, recs))
    # against fx/1 (100/s): x2 150 / 200 = 0.75; the short x1 run 300 / 100 = 3.0
    assert (g["baseline_job"], g["baseline_short_run"]) == ("fx/1", False)
    assert {m["job"]: m["scaling_efficiency"] for m in g["runs"]} == pytest.approx({"fx/0": 3.0, "fx/1": 1.0,
                                                                                   "fx/2": 0.75})


def test_a_group_of_short_runs_at_its_smallest_world_says_so(tmp_path):
    recs = [_rec(0, "ddp", 1, 16, 300.0, short_run=True), _rec(1, "ddp", 2, 16, 150.0),
            _rec(2, "fsdp", 1, 16, 100.0), _rec(3, "fsdp", 2, 16, 160.0)]
    summary = _sweep(tmp_path, recs)
    by = {g["strategy"]: g for g in summary["groups"] if g["kind"] == "strong"}
    assert (by["ddp"]["baseline_job"], by["ddp"]["baseline_short_run"]) == ("fx/0", True)
    assert by["fsdp"]["baseline_short_run"] is False
    attach_efficiency(recs, summary)
    _, rows = _markdown(recs)
    # ddp x2: 150 / (2 x 300) = 0.25 against the short run; fsdp x2: 160 / 200 = 0.80, steady
    assert {j: r["efficiency"] for j, r in rows.items()} == {
        "fx/0": "1.00 (vs short run)", "fx/1": "0.25 (vs short run)", "fx/2": "1.00", "fx/3": "0.80"}
    assert "every run at its group's smallest world size was a short run" in render(recs)
    eff = charts.efficiency([summary], recs, "strong")
    assert [t["name"] for t in eff["traces"]] == ["ddp b16 (vs short run)", "fsdp b16", "ideal"]

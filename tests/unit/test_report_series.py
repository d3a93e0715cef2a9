"""The dashboard's series across sweeps and its colours (walkthrough of `scalelab compare A B
--format html`): runs of two sweeps never share a series, legends stay short, and a strategy has
one colour on every chart. Hand-made run records (tests/unit/test_report.py's), no training."""
from __future__ import annotations

import json
import re

import pytest

from scalelab.results import charts
from scalelab.results.record import read_records, write_json
from scalelab.results import report
from scalelab.results.sweep import aggregate, attach_efficiency

from .test_report import _rec, make_sweep

A, B = "2026-12-01_21-26-13", "2026-12-01_22-40-02"


def _sweep(root, name, runs):
    """A sweep dir of (strategy, world, batch, tokens/s, final loss) runs whose run.json name it."""
    d = root / "outputs" / "sweeps" / name
    for i, (strategy, world, batch, tok, final) in enumerate(runs):
        (d / str(i)).mkdir(parents=True)
        write_json(d / str(i) / "run.json", _rec(i, strategy, world, batch, tok / 64, final=final,
                                                 job={"name": f"{name}/{i}", "sweep_dir": str(d)}))
    return d


@pytest.fixture()
def two(tmp_path):
    """Before/after: ddp b16 at 1 and 2 ranks (41,300 then 52,588 tokens/s at 2), and b32 at 2."""
    a = _sweep(tmp_path, A, [("ddp", 1, 16, 25600.0, 3.0), ("ddp", 2, 16, 41300.0, 2.8), ("ddp", 2, 32, 48000.0, 2.5)])
    b = _sweep(tmp_path, B, [("ddp", 1, 16, 30000.0, 2.6), ("ddp", 2, 16, 52588.0, 2.4), ("ddp", 2, 32, 56000.0, 2.3)])
    recs = read_records([a, b])
    sums = [aggregate(a, write=False), aggregate(b, write=False)]
    for s in sums:
        attach_efficiency(recs, s)
    return recs, sums


def test_throughput_of_two_sweeps_is_two_series(two):
    recs, _ = two
    ch = charts.throughput(recs)
    assert [(t["name"], t["x"], t["y"]) for t in ch["traces"]] == [
        (f"{A}: ddp b16", [1, 2], [25600.0, 41300.0]),    # not median(41300, 52588) = 46944
        (f"{A}: ddp b32", [2], [48000.0]),
        (f"{B}: ddp b16", [1, 2], [30000.0, 52588.0]),
        (f"{B}: ddp b32", [2], [56000.0])]
    one = charts.throughput([r for r in recs if r["job"]["name"].startswith(A)])
    assert [t["name"] for t in one["traces"]] == ["ddp b16", "ddp b32"]       # one sweep: no label


def test_lr_scaling_of_two_sweeps_is_two_series(two):
    ch = charts.lr_scaling(two[0])
    assert [(t["name"], t["x"], t["y"]) for t in ch["traces"]] == [
        (f"{A}: lr_rule=none", [16, 32], [2.9, 2.5]),      # b16: median(3.0, 2.8), not of all four
        (f"{B}: lr_rule=none", [16, 32], [2.5, 2.3])]


def test_group_by_sweep_dir_legends_are_the_sweeps_names(two):
    recs, sums = two
    for ch in (charts.efficiency(sums, recs, "strong", "job.sweep_dir"),
               charts.efficiency(sums, recs, "weak", "job.sweep_dir"), charts.throughput(recs, "job.sweep_dir")):
        names = [t["name"] for t in ch["traces"]]
        assert not any("sweeps/" in n or "[" in n for n in names), names           # no full path, no repeat
    weak = charts.efficiency(sums, recs, "weak", "job.sweep_dir")
    assert [t["name"] for t in weak["traces"]] == [f"{A}: ddp 16/rank", f"{B}: ddp 16/rank", "ideal"]
    one = charts.throughput([r for r in recs if r["job"]["name"].startswith(B)], "job.sweep_dir")
    assert one["traces"][0]["name"] == f"ddp b16 [job.sweep_dir={B}]"


def test_sweep_labels_and_recommends_names(tmp_path):
    x, y = tmp_path / "runs1" / "verify", tmp_path / "runs2" / "verify"
    assert charts.sweep_labels([str(x), str(y)]) == {str(x): "runs1/verify", str(y): "runs2/verify"}
    assert charts.sweep_labels([str(x), str(x)]) == {}
    # series are keyed by label: two dirs whose last two parts match still get two labels
    assert charts.sweep_labels(["/a/exp/sweep", "/b/exp/sweep"]) == {"/a/exp/sweep": "a/exp/sweep",
                                                                     "/b/exp/sweep": "b/exp/sweep"}
    assert charts.sweep_labels([str(x), None], {x: "verification"}) == {str(x): "verification", None: "no sweep"}


def test_long_legends_go_below_the_plot(two):
    recs, sums = two
    long_ = report.figure(charts.efficiency(sums, recs, "weak", "job.sweep_dir"))
    assert long_["layout"]["legend"]["orientation"] == "h" and long_["layout"]["legend"]["y"] < 0
    assert long_["layout"]["height"] > 420
    short = report.figure(charts.throughput(recs[:3]))
    assert "orientation" not in short["layout"]["legend"] and short["layout"]["height"] == 420


def _figs(page: str) -> dict:
    start = page.index("const FIGS=") + len("const FIGS=")
    return json.JSONDecoder().raw_decode(page, start)[0]


def _color(fig: dict, name: str) -> str:
    return next(d["line"]["color"] for d in fig["data"] if d["name"] == name)


def test_a_strategy_has_one_colour_on_every_chart(tmp_path):
    fx = make_sweep(tmp_path / "fx")
    recs, summary = read_records([fx]), aggregate(fx, write=False)
    attach_efficiency(recs, summary)
    figs = _figs(report.render_html(recs, [summary]))
    # trace order differs (strong: ddp, fsdp; throughput: ddp b16, ddp b32, fsdp b16, single b16): colours do not
    ddp, fsdp = _color(figs["efficiency_strong"], "ddp b16"), _color(figs["efficiency_strong"], "fsdp b16")
    assert _color(figs["throughput"], "ddp b16") == ddp and _color(figs["throughput"], "fsdp b16") == fsdp
    colors = {"ddp": ddp, "fsdp": fsdp, "single": _color(figs["throughput"], "single b16")}
    for d in figs["loss"]["data"]:
        assert d["line"]["color"] == colors[d["name"].split()[1]], d["name"]
    assert report.strategy_colors(recs) == {**colors, "zero2": report.PALETTE[3]}   # sorted: ddp fsdp single zero2
    assert len(set(colors.values())) == 3
    # series of one strategy on one chart: one colour, told apart by dash and marker
    same = [d for d in figs["throughput"]["data"] if d["name"].startswith("ddp ")]
    assert len({d["line"]["color"] for d in same}) == 1 and len({d["line"]["dash"] for d in same}) == 2
    # series that are not strategies never take a strategy's colour
    others = {d["marker"]["color"] for d in figs["memory"]["data"]} | {d["line"]["color"]
                                                                       for d in figs["lr_scaling"]["data"]}
    assert not others & set(report.strategy_colors(recs).values())


def test_page_names_the_sweeps_series(two):
    recs, sums = two
    page = report.render_html(recs, sums, group_by="job.sweep_dir")
    names = [d["name"] for d in _figs(page)["throughput"]["data"]]
    assert names == [f"{A}: ddp b16", f"{A}: ddp b32", f"{B}: ddp b16", f"{B}: ddp b32"]
    assert not re.search(r"\[job\.sweep_dir=/", page)


def test_the_logger_splits_speeds_not_losses(tmp_path):
    """logger=none,csv in one sweep: csv's per-step save is in the step time, so the throughput chart
    has a series per logger; the loss does not depend on it, so the LR chart keeps one series
    (b16: median(3.0, 2.8) = 2.9)."""
    d = _sweep(tmp_path, A, [("ddp", 1, 16, 25600.0, 3.0), ("ddp", 1, 16, 20000.0, 2.8), ("ddp", 2, 32, 48000.0, 2.5)])
    for i, name in enumerate(("none", "csv", "none")):
        rec = json.loads((d / str(i) / "run.json").read_text())
        rec.setdefault("config", {})["logger"] = {"name": name}
        write_json(d / str(i) / "run.json", rec)
    recs = read_records([d])
    speeds = charts.throughput(recs)
    assert sorted((t["name"], t["x"], t["y"]) for t in speeds["traces"]) == [
        ("ddp 16/rank logger=csv", [1], [20000.0]), ("ddp 16/rank logger=none", [1, 2], [25600.0, 48000.0])]
    losses = charts.lr_scaling(recs)
    assert [(t["x"], t["y"]) for t in losses["traces"]] == [([16, 32], [2.9, 2.5])]

"""Scaling-efficiency groups (results.sweep): runs that set data.micro_batch_size differently are
different series, each against its own 1-device run; a group whose 1-device run failed is measured
against its smallest completed world and the table says so; the device's peak memory is a column
wherever runs recorded it (CUDA). Expected efficiencies by hand: thr(N) / (N/N0 x thr(N0))."""
import pytest

from scalelab.results.record import write_json
from scalelab.results.sweep import aggregate, attach_efficiency
from scalelab.results.table import render

from .test_results import _rec


def _micro(job, world, micro, thr):
    r = _rec(job, "ddp", world, 32, thr)
    r["config"]["data"]["micro_batch_size"] = micro
    r["per_device_batch_size"], r["accumulate_grad_batches"] = micro, 32 // world // micro
    return r


def _write(root, runs):
    for i, r in enumerate(runs):
        (root / str(i)).mkdir()
        write_json(root / str(i) / "run.json", r)


def test_a_micro_batch_sweep_is_one_series_per_micro_batch(tmp_path):
    _write(tmp_path, [_micro("S/0", 1, 16, 100.0), _micro("S/1", 1, 4, 60.0), _micro("S/2", 2, 16, 180.0),
                      _micro("S/3", 2, 4, 110.0)])
    groups = [g for g in aggregate(tmp_path)["groups"] if g["kind"] == "strong"]
    eff = {m["job"]: m["scaling_efficiency"] for g in groups for m in g["runs"]}
    # was one group against S/0: S/1 0.60, S/3 110 / (2 x 100) = 0.55
    assert eff == pytest.approx({"S/0": 1.0, "S/2": 180 / 200, "S/1": 1.0, "S/3": 110 / 120})
    assert sorted(g["baseline_job"] for g in groups) == ["S/0", "S/1"]


def test_a_group_without_its_1_device_run_says_its_baseline(tmp_path):
    runs = [_rec("f/0", "fsdp", 1, 16, 0.0, status="failed"), _rec("f/1", "fsdp", 2, 16, 90.0),
            _rec("f/2", "fsdp", 4, 16, 170.0), _rec("d/0", "ddp", 1, 16, 50.0), _rec("d/1", "ddp", 2, 16, 80.0)]
    _write(tmp_path, runs)
    summary = aggregate(tmp_path)
    attach_efficiency(runs, summary)
    table = render(runs)
    row = {line.split()[0]: line for line in table.splitlines()[2:]}
    assert "1.00 (vs 2)" in row["f/1"] and "0.94 (vs 2)" in row["f/2"]      # 170 / (2 x 90)
    assert row["d/1"].split()[-2] == "0.80" and "(vs" not in row["d/1"]       # 80 / (2 x 50)


def test_the_device_s_peak_is_a_column_where_runs_have_it():
    cpu, gpu = _rec("c/0", "ddp", 2, 16, 1.0), _rec("g/0", "fsdp", 2, 16, 1.0)
    gpu["memory"]["peak_device_bytes_per_rank"] = [3 * 2**30, 5 * 2**30]
    assert "device MiB/rank" not in render([cpu])
    head, _, *rows = [[c.strip() for c in line.strip("|").split("|")] for line in
                      render([cpu, gpu], fmt="markdown").splitlines()]
    col = head.index("device MiB/rank")
    assert {r[0]: r[col] for r in rows} == {"c/0": "-", "g/0": "5120"}        # max over ranks, MiB


def test_a_pipeline_s_micro_batches_show_in_the_split():
    """strategy=pipeline at 2 ranks, batch 16, strategy.microbatches=4: each step runs 4 micro-batches
    of 4 (the table said 16x1, while plan and recommend said 4 x 4)."""
    pipe = _rec("p/0", "pipeline", 2, 16, 1.0)
    pipe.update(per_device_batch_size=16, accumulate_grad_batches=1, pipeline={"microbatches": 4, "stages": 2})
    ddp = _rec("d/0", "ddp", 2, 16, 1.0)
    head, _, *rows = [[c.strip() for c in line.strip("|").split("|")] for line in
                      render([pipe, ddp], fmt="markdown").splitlines()]
    col = head.index("micro x acc")
    assert {r[0]: r[col] for r in rows} == {"p/0": "4x4 pp", "d/0": "8x1"}


def test_a_run_left_without_a_baseline_is_named_under_the_table(tmp_path):
    # fsdp's only other run failed: its 2-device run has "-" in the efficiency column, and a note says why
    runs = [_rec("e/0", "ddp", 1, 16, 50.0), _rec("e/1", "ddp", 2, 16, 80.0),
            _rec("e/2", "fsdp", 1, 16, 0.0, status="failed"), _rec("e/3", "fsdp", 2, 16, 70.0)]
    _write(tmp_path, runs)
    records = [dict(r) for r in runs]
    attach_efficiency(records, aggregate(tmp_path))
    assert [r.get("scaling_efficiency") for r in records] == [1.0, 0.8, None, None]
    text = render(records)
    assert ("efficiency - (e/3): no completed run of the same config at another world size to measure against "
            "(it failed or was not swept)") in text
    # one world size swept only: no efficiency column, nothing to explain
    assert "efficiency -" not in render([dict(runs[0])])


def test_the_efficiency_charts_name_the_runs_left_out_and_the_failed_ones(tmp_path):
    from scalelab.results.charts import efficiency as efficiency_chart

    runs = [_rec("e/0", "ddp", 1, 16, 50.0), _rec("e/1", "ddp", 2, 16, 80.0),
            _rec("e/2", "fsdp", 1, 16, 0.0, status="failed"), _rec("e/3", "fsdp", 2, 16, 70.0)]
    for r in runs:
        r["job"]["sweep_dir"] = str(tmp_path.resolve())
    _write(tmp_path, runs)
    summary = aggregate(tmp_path)
    records = [dict(r) for r in runs]
    attach_efficiency(records, summary)
    strong = efficiency_chart([summary], records, "strong")
    assert [t["name"] for t in strong["traces"]] == ["ddp b16", "ideal"]        # fsdp's line: no baseline
    assert ("efficiency - (e/3): no completed run of the same config at another world size to measure against (it "
            "failed or was not swept); failed, so in no group: e/2") in strong["notes"]
    weak = efficiency_chart([summary], records, "weak")
    assert weak["notes"] == ["no weak-scaling group: no completed runs that differ only in world size with the same "
                             "per-rank batch; failed, so in no group: e/2"]

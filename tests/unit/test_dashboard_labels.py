"""The dashboard names runs of two sweeps in folders of one name (`A/sw`, `B/sw`, both with a job
"sw/0") as compare's table does: "A/sw/0" and "B/sw/0" in its run table, the memory and breakdown
bar charts' categories and the failed list. Before, the table showed "sw/0" twice and the bar
charts drew both runs' bars on one "sw/0 r0" category, stacked into one bar."""
from __future__ import annotations

from scalelab.results import charts
from scalelab.results.record import read_records, write_json

from .test_report import MIB, _rec


def _runs(tmp_path, status_b="completed"):
    for parent, status in (("A", "completed"), ("B", status_b)):
        sw = tmp_path / parent / "sw"
        (sw / "0").mkdir(parents=True)
        write_json(sw / "0" / "run.json", _rec(
            0, "ddp", 1, 16, 100.0, status=status,
            job={"name": "sw/0", "sweep_dir": str(sw.resolve()), "group": "sw"},
            memory={"model_state_breakdown_per_rank": [{"params": MIB, "grads": MIB, "optimizer": 2 * MIB}]},
            breakdown={"comm_fraction": 0.1, "per_rank": [{"compute_s": 0.01, "transfer_s": 0.001, "wait_s": 0.0}]}))
    return read_records([tmp_path / "A", tmp_path / "B"])


def test_memory_and_breakdown_bars_are_one_per_run(tmp_path):
    recs = _runs(tmp_path)
    assert charts.memory(recs)["traces"][0]["x"] == ["A/sw/0 r0", "B/sw/0 r0"]      # before: sw/0 r0 twice
    assert charts.breakdown(recs)["traces"][0]["x"] == ["A/sw/0 r0", "B/sw/0 r0"]
    assert [t["name"].split()[0] for t in charts.loss_curves(recs)["traces"]] == ["A/sw/0", "B/sw/0"]


def test_html_run_table_and_failed_list_tell_the_runs_apart(tmp_path):
    from scalelab.results.report import tables

    recs = _runs(tmp_path, status_b="failed")
    summary, _ = tables(recs)
    assert "<td>A/sw/0</td>" in summary and "<td>B/sw/0</td>" in summary, summary   # before: <td>sw/0</td> twice
    assert [f["job"] for f in charts.failed(recs)] == ["B/sw/0"]


def test_one_sweep_keeps_its_short_names(tmp_path):
    recs = _runs(tmp_path)[:1]
    assert charts.memory(recs)["traces"][0]["x"] == ["sw/0 r0"]


def test_planner_bars_are_one_per_run(tmp_path):
    """The planner charts named a smoothed copy of each run, which job_labels (keyed by the
    original's id) did not know: A/sw/0 and B/sw/0 were one "sw/0" category, and Plotly drew the
    sum of their step times (50 + 80 ms) and memories as one bar."""
    from .test_report import NANO, _states

    for parent, step_s, device in (("A", 0.05, 1024), ("B", 0.08, 2048)):
        sw = tmp_path / parent / "sw"
        (sw / "0").mkdir(parents=True)
        write_json(sw / "0" / "run.json", _rec(
            0, "single", 1, 16, 1000.0, precision="bf16-mixed", model=NANO,
            job={"name": "sw/0", "sweep_dir": str(sw.resolve()), "group": "sw"},
            hardware={"accelerator": "cuda", "threads_per_rank": 8},
            memory={"model_state_breakdown_per_rank": _states(4, 4, 8, 1),
                    "peak_device_bytes_per_rank": [device * MIB], "model_state_bytes_per_rank": [16 * MIB]},
            mfu={"value": 0.3, "hardware_profile": "h200"}, step_time_s={"median": step_s, "p90": step_s}))
    step, mem = charts.planner(read_records([tmp_path / "A", tmp_path / "B"]))
    assert step["traces"][0]["x"] == ["A/sw/0", "B/sw/0"]                       # before: sw/0 twice
    assert step["traces"][0]["y"] == [50.0, 80.0]
    assert mem["traces"][0]["x"] == ["A/sw/0", "B/sw/0"] and mem["traces"][0]["y"] == [1024.0, 2048.0]

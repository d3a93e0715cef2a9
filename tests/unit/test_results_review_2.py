"""Every job of a sweep is counted somewhere (review, 2026-12-03): a job whose launcher was killed
(kill -9 of scalelab-train, the OOM killer) leaves a folder with its config and ranks.log but no
run.json, and an unreadable run.json is no row; the headline said '1 completed, 0 failed' and the
dashboard '1 runs' for a sweep of three jobs."""
import json
import subprocess
import sys

from scalelab.results.callbacks import summarize_sweep
from scalelab.results.record import write_json
from scalelab.results.sweep import aggregate, jobs_without_record

from .test_results import _rec


def _sweep(root):
    (root / "0").mkdir()
    write_json(root / "0" / "run.json", _rec("s/0", "ddp", 1, 16, 100.0))
    killed = root / "1"                      # what the launcher wrote before its ranks ran
    (killed / ".hydra").mkdir(parents=True)
    (killed / "config_resolved.yaml").write_text("strategy: {name: ddp}\n")
    (killed / "ranks.log").write_text("[rank 0] step 40\n")
    (root / "2").mkdir()
    (root / "2" / "run.json").write_text('{"status": "comp')       # truncated by a full disk
    (root / ".submitit").mkdir()                                    # not a job folder
    (root / "10").mkdir()
    (root / "10" / "config_resolved.yaml").write_text("{}\n")       # another killed one, sorted by number
    return root


def test_a_job_folder_without_a_record_and_an_unreadable_record_are_counted(tmp_path, capsys):
    sweep = _sweep(tmp_path)
    assert jobs_without_record(sweep) == ["1", "10"]
    summary = aggregate(sweep)
    assert (summary["num_completed"], summary["num_failed"], summary["num_skipped"], summary["num_no_record"]) \
        == (1, 0, 1, 2)
    assert json.loads((sweep / "sweep.json").read_text())["no_record"] == ["1", "10"]
    summarize_sweep(sweep)
    out = capsys.readouterr().out
    assert f"== sweep {sweep}: 1 completed, 0 failed, 1 unreadable run.json, 2 without a record ==" in out
    assert f"NO RECORD {sweep / '1'}: no run.json: its launcher was killed" in out
    assert f"UNREADABLE {sweep / '2' / 'run.json'}: " in out
    page = (sweep / "report.html").read_text()
    assert "1 runs: 1 completed, 0 failed, 1 unreadable run.json, 2 job folder(s) without a record." in page
    assert f"<b>no record</b> {sweep / '10'}" in page and f"<b>unreadable</b> {sweep / '2' / 'run.json'}" in page


def test_compare_says_which_job_folders_have_no_record(tmp_path):
    sweep = _sweep(tmp_path)
    (sweep / "multirun.yaml").write_text("{}\n")
    rec = json.loads((sweep / "0" / "run.json").read_text())
    rec["job"].update(sweep_dir=str(sweep.resolve()), dir="0")
    write_json(sweep / "0" / "run.json", rec)
    proc = subprocess.run([sys.executable, "-m", "scalelab.cli", "compare", str(sweep)], capture_output=True,
                          text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr
    assert f"no record {sweep.resolve() / '1'}: no run.json" in proc.stderr
    assert f"no record {sweep.resolve() / '10'}: no run.json" in proc.stderr


def test_no_w_and_b_summary_run_for_a_sweep_whose_jobs_logged_nowhere(tmp_path, wandb_env):
    """`-m logger=none,csv` under the default logger wandb: the summary run was made all the same."""
    for i, (world, logger) in enumerate(((1, "none"), (2, "csv"))):
        rec = _rec(f"w/{i}", "ddp", world, 16, 100.0 * world)
        rec["config"]["logger"] = {"name": logger}
        (tmp_path / "quiet" / str(i)).mkdir(parents=True)
        write_json(tmp_path / "quiet" / str(i) / "run.json", rec)
    base_logger = {"name": "wandb", "mode": "offline", "project": "scalelab-test"}
    assert "wandb_run_id" not in summarize_sweep(tmp_path / "quiet", base_logger, when_used=True)
    assert not (tmp_path / "quiet" / "wandb").exists()
    # one job logged to W&B: the sweep's summary run is made
    rec = json.loads((tmp_path / "quiet" / "1" / "run.json").read_text())
    rec["config"]["logger"] = {"name": "wandb", "mode": "offline"}
    write_json(tmp_path / "quiet" / "1" / "run.json", rec)
    assert summarize_sweep(tmp_path / "quiet", base_logger, when_used=True)["wandb_run_id"]
    assert (tmp_path / "quiet" / "wandb").is_dir()


def test_a_missing_sweep_and_a_control_character_are_said_plainly(tmp_path):
    proc = subprocess.run([sys.executable, "-m", "scalelab.cli", "aggregate", str(tmp_path / "nope")],
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode == 2 and proc.stderr == f"error: {tmp_path / 'nope'} does not exist (give a sweep dir, " \
                                                   "e.g. outputs/sweeps/<time>)\n"
    from scalelab.results.record import BadRecord, load_record

    (tmp_path / "run.json").write_text('{"a": "x\ty"}')
    try:
        load_record(tmp_path / "run.json")
    except BadRecord as e:
        assert str(e) == "not valid JSON (truncated or corrupt): Invalid control character at line 1 column 9"
    else:
        raise AssertionError("a raw tab inside a JSON string was read")


def test_a_column_header_as_a_key_names_the_key_it_shows():
    """`compare --sort=-samples/s` (the table's header) said only 'no run has this key'."""
    import pytest as _pytest

    from scalelab.results.select import HEADER_KEYS, MISSING, SelectError, check_key, lookup
    from scalelab.results.table import COLUMNS

    from .test_report import _rec

    rec = _rec(0, "ddp", 2, 16, 100.0, breakdown={"comm_fraction": 0.1}, scaling_efficiency=0.9,
               memory={"peak_rss_bytes_per_rank": [1, 2], "model_state_bytes_per_rank": [1, 2],
                       "peak_device_bytes_per_rank": [1, 2]})
    rec["config"].setdefault("lr_scaling", {})["warmup_steps"] = 0   # as every run.json has it
    headers = {h for h, _, _ in COLUMNS}
    for header, key in HEADER_KEYS.items():
        assert header in headers and lookup(rec, key) is not MISSING, (header, key)
    with _pytest.raises(SelectError, match=r"^--sort '-samples/s': no run has this key; the column samples/s is "
                                           r"the key throughput.samples_per_s, in run.json's units \(seconds, bytes, fractions\) \("):
        check_key([rec], "-samples/s", "--sort")

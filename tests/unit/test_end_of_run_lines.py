"""What a job and a sweep print at their end (found by review): a failed job of a sweep was
announced twice ("[scalelab] job X FAILED: timed out (trainer.timeout_s)" then "[scalelab] X:
failed"), without the limit it ran into; a single run ended with its table only (its folder was in
the first line, scrolled away), and a sweep with sweep.json and report.html but no compare command."""
from __future__ import annotations

import logging
import os
import sys
from pathlib import Path

import pytest

from scalelab import train


# the compare command to copy: this environment's scalelab by its path, PATH not finding it (`make run`
# printed the bare `scalelab`: 'command not found' without an activated venv)
_SCALELAB = str(Path(sys.executable).parent / "scalelab")


@pytest.fixture
def lines(monkeypatch, tmp_path):
    """The lines train.log (the scalelab logger) gets, and the failed jobs the command lists. Run
    from tmp_path without the environment's bin on PATH: the compare command is its scalelab's path."""
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("PATH", "/usr/bin:/bin")
    got: list[str] = []

    class Keep(logging.Handler):
        def emit(self, record):
            got.append(record.getMessage())

    keep = Keep(level=logging.INFO)
    train.log.addHandler(keep)
    old_level = train.log.level
    train.log.setLevel(logging.INFO)
    monkeypatch.setattr(train, "_FAILED", [])
    yield got
    train.log.removeHandler(keep)
    train.log.setLevel(old_level)


def _failed(name: str) -> dict:
    return {"status": "failed", "error": "timed out after trainer.timeout_s=3 s", "strategy": "ddp",
            "world_size": 2, "job": {"name": name}}


def test_a_failed_job_of_a_sweep_is_one_line(lines, tmp_path):
    train.report_end(_failed("sw/0"), "sw/0", tmp_path, multirun=True)
    about = [ln for ln in lines if "sw/0" in ln]
    assert about == ["[scalelab] job sw/0 FAILED: timed out after trainer.timeout_s=3 s"], lines
    assert train._FAILED == ["sw/0: timed out after trainer.timeout_s=3 s"]


def test_a_completed_job_of_a_sweep_is_its_one_line(lines, tmp_path):
    rec = {"status": "completed", "job": {"name": "sw/1"}, "throughput": {"samples_per_s": 10.0},
           "step_time_s": {"median": 0.1, "measured_steps": 20}, "loss": {"final": 3.0}}
    train.report_end(rec, "sw/1", tmp_path, multirun=True)
    assert [ln for ln in lines if "sw/1" in ln] == ["[scalelab] sw/1: completed, 10.0 samples/s, step 100.0 ms "
                                                     "(median of 20), loss 3.0"]


@pytest.mark.parametrize("status", ["completed", "failed"])
def test_a_single_run_ends_with_its_record_and_the_compare_command(lines, tmp_path, status):
    job = tmp_path / "outputs" / "runs" / "2026-01-01_00-00-00"
    rec = _failed(job.name) if status == "failed" else {
        "status": "completed", "strategy": "ddp", "world_size": 2, "job": {"name": job.name},
        "throughput": {"samples_per_s": 10.0}, "step_time_s": {"median": 0.1}, "loss": {"final": 3.0}}
    train.report_end(rec, job.name, job, multirun=False)
    assert lines[-1] == f"results: {job / 'run.json'}  (compare: {_SCALELAB} compare {job} OTHER_RUN_OR_SWEEP ...)"
    assert sum("FAILED" in ln for ln in lines) == (status == "failed")


def test_a_timed_out_job_s_error_gives_the_limit():
    from omegaconf import OmegaConf

    assert train.timed_out(OmegaConf.create({"trainer": {"timeout_s": 3}})) == "timed out after trainer.timeout_s=3 s"
    assert train.timed_out(OmegaConf.create({"trainer": {"timeout_s": 2.5}})) == \
        "timed out after trainer.timeout_s=2.5 s"


def test_a_sweep_ends_with_the_compare_command_for_its_folder(tmp_path, monkeypatch, capsys):
    from scalelab.results import callbacks, report
    from scalelab.results.record import write_json

    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("PATH", "/usr/bin:/bin")

    sweep = tmp_path / "sweeps" / "2026-01-01_00-00-00"
    for num, world in enumerate((1, 2)):
        (sweep / str(num)).mkdir(parents=True)
        write_json(sweep / str(num) / "run.json", {
            "status": "completed", "strategy": "ddp", "world_size": world, "num_nodes": 1, "devices_per_node": world,
            "global_batch_size": 16, "throughput": {"samples_per_s": 100.0 * world, "tokens_per_s": None},
            "step_time_s": {"median": 0.1, "p90": 0.1}, "loss": {"first": 5.0, "final": 3.0},
            "job": {"name": f"{sweep.name}/{num}", "sweep_dir": str(sweep), "num": num}})
    monkeypatch.setattr(report, "write_report", lambda path, *a, **k: path)   # the dashboard: not this test's
    callbacks.summarize_sweep(sweep)
    out = capsys.readouterr().out.rstrip().splitlines()
    assert out[-1].startswith(f"compare: {_SCALELAB} compare {sweep}"), out[-3:]
    assert any(ln.startswith("sweep summary: ") for ln in out) and any(ln.startswith("report: ") for ln in out)


def test_the_command_to_copy_is_the_one_path_finds_else_its_path(monkeypatch, tmp_path):
    from scalelab.paths import command

    bin_dir = Path(sys.executable).parent
    monkeypatch.delenv("MAKELEVEL", raising=False)            # (`make test` sets it)
    monkeypatch.setenv("PATH", "/usr/bin:/bin")
    monkeypatch.chdir(bin_dir.parent.parent)                  # the checkout holding .venv
    assert command("scalelab") == os.path.join(bin_dir.parent.name, bin_dir.name, "scalelab")   # .venv/bin/scalelab
    monkeypatch.setenv("MAKELEVEL", "1")                      # make -C CHECKOUT: the shell may be anywhere
    assert command("scalelab") == str(bin_dir / "scalelab")
    monkeypatch.delenv("MAKELEVEL")
    monkeypatch.chdir(tmp_path)
    assert command("scalelab") == str(bin_dir / "scalelab")
    monkeypatch.setenv("PATH", f"{bin_dir}:/usr/bin:/bin")    # an activated venv
    assert command("scalelab") == "scalelab"


def test_a_cpu_sweep_s_table_says_what_cpu_figures_show():
    from scalelab.results.callbacks import cpu_note

    cpu2 = {"world_size": 2, "devices_per_node": 2, "hardware": {"accelerator": "cpu"}}
    two_nodes = {"world_size": 2, "devices_per_node": 1, "hardware": {"accelerator": "cpu"}}   # a rank a host
    assert cpu_note([two_nodes]) is None
    assert cpu_note([{"world_size": 1, "hardware": {"accelerator": "cpu"}}, cpu2]).startswith(
        "note: CPU ranks share one host's memory bus and caches")
    assert cpu_note([{"world_size": 1, "hardware": {"accelerator": "cpu"}}]) is None        # one rank: nothing shared
    assert cpu_note([{"world_size": 8, "hardware": {"accelerator": "cuda"}}]) is None


def test_compare_says_it_under_its_table_too(tmp_path, capsys):
    """`scalelab compare` printed the same table without the line (review); csv and json stay data."""
    from scalelab.cli import main
    from scalelab.results.record import write_json

    from .test_report import _rec

    for i, world in enumerate((1, 2)):   # CPU ranks, a node's worth each (_rec's hardware and devices_per_node)
        (tmp_path / str(i)).mkdir()
        write_json(tmp_path / str(i) / "run.json", _rec(i, "ddp", world, 16, 100.0))
    for fmt, said in (("table", True), ("csv", False), ("json", False)):
        with pytest.raises(SystemExit) as done:
            main(["compare", str(tmp_path), "--format", fmt])
        out = capsys.readouterr().out
        assert done.value.code == 0 and out.rstrip().splitlines()[-1].startswith("note: CPU ranks share") is said, out

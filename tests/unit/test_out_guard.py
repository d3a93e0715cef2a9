"""Every --out (slurm render, k8s render, plan --probe / --calibrate, compare) goes through one guard,
paths.out_problem: it never replaces a run's or a sweep's record (run.json, sweep.json,
config_resolved.yaml, multirun.yaml) nor writes inside a job folder; one line, exit 2, the record
unchanged. Before: `slurm render --out RUN/run.json` replaced the record with a script, exit 0."""
from __future__ import annotations

import pytest

from scalelab.results.record import write_json

from .test_report import _rec
from ..conftest import run_cli


@pytest.fixture()
def results(tmp_path):
    """RUN (a single run's folder, as train.py leaves it) and SWEEP (multirun.yaml, sweep.json, jobs 0 and 1)."""
    run = tmp_path / "runs" / "good1"
    (run / ".hydra").mkdir(parents=True)
    write_json(run / "run.json", _rec(0, "ddp", 1, 16, 100.0))
    (run / "config_resolved.yaml").write_text("seed: 0\n")
    sweep = tmp_path / "sweeps" / "sw1"
    sweep.mkdir(parents=True)
    (sweep / "multirun.yaml").write_text("hydra: {}\n")
    (sweep / "sweep.json").write_text("{}\n")
    for i in (0, 1):
        (sweep / str(i)).mkdir()
        write_json(sweep / str(i) / "run.json", _rec(i, "ddp", i + 1, 16, 100.0))
    return run, sweep


def _contents(*folders):
    return {p: p.read_bytes() for f in folders for p in sorted(f.rglob("*")) if p.is_file()}


@pytest.mark.parametrize("argv", [
    ["slurm", "render", "--cpu", "--out", "{run}/run.json", "strategy=ddp"],
    ["k8s", "render", "--cpu", "--nodes", "2", "--devices", "1", "--image", "img", "--out", "{sweep}/sweep.json"],
    ["k8s", "render", "--cpu", "--nodes", "2", "--devices", "1", "--image", "img", "--out", "{sweep}/multirun.yaml"],
    ["plan", "--calibrate", "{sweep}", "--out", "{sweep}/sweep.json"],
    ["plan", "--probe", "--out", "{run}/config_resolved.yaml"],
    ["plan", "--probe", "--out", "{run}/profile.yaml"],                  # a new file, inside a job folder
    ["compare", "{sweep}/0", "--format", "csv", "--out", "{sweep}/1/run.json"],   # a sibling job's record
    ["compare", "{sweep}/0", "--format", "csv", "--out", "{run}/run.json"],       # a record outside the inputs
    ["compare", "{sweep}/0", "--format", "csv", "--out", "{sweep}/1/table.csv"],
])
def test_no_out_replaces_a_record(results, capsys, argv):
    run, sweep = results
    argv = [a.format(run=run, sweep=sweep) for a in argv]
    before = _contents(run, sweep)
    code, cap = run_cli(argv, capsys)
    out = argv[argv.index("--out") + 1]
    assert code == 2 and cap.err.startswith(f"error: --out {out} ") and cap.err.count("\n") == 1, cap.err
    assert "choose a path outside run and sweep folders" in cap.err or "input folder" in cap.err, cap.err
    assert _contents(run, sweep) == before and "Traceback" not in cap.err


def test_the_guard_names_what_it_protects(results, tmp_path):
    from scalelab.paths import out_problem   # here: the CLI cases above run (and fail) without it

    run, sweep = results
    for name in ("run.json", "sweep.json", "config_resolved.yaml", "multirun.yaml"):   # anywhere, existing
        (tmp_path / "loose").mkdir(exist_ok=True)
        (tmp_path / "loose" / name).write_text("x")
        assert f"is an existing {name}" in out_problem(tmp_path / "loose" / name)
    assert "inside the job folder" in out_problem(run / ".hydra" / "config.yaml")
    assert "inside the sweep folder" in out_problem(sweep / "slurm" / "jobs.json")      # the launcher's ids
    assert "inside the sweep folder" in out_problem(sweep / "run.json")                 # a record name, new
    # what stays writable: a new file beside a sweep's report, anywhere outside results, a new run.json elsewhere
    assert out_problem(sweep / "table.csv") is None
    assert out_problem(sweep / "report.html") is None                   # not yet written: nothing to replace
    assert out_problem(tmp_path / "reports" / "table.csv") is None
    assert out_problem(tmp_path / "fresh" / "run.json") is None


def test_compare_keeps_a_sweeps_own_dashboard(results, capsys):
    """`compare SWEEP OTHER --out SWEEP/report.html` replaced the dashboard the sweep wrote (found by
    review): refused, with a name beside it that may be written."""
    run, sweep = results
    (sweep / "report.html").write_text("<html>the sweep's</html>")
    before = _contents(run, sweep)
    code, cap = run_cli(["compare", str(sweep), str(run), "--format", "html", "--out", str(sweep / "report.html")],
                        capsys)
    assert code == 2 and cap.err == (f"error: --out {sweep / 'report.html'} is the sweep's own dashboard "
                                     f"(scalelab aggregate {sweep} writes it): give another name, e.g. "
                                     f"{sweep / 'compare.html'}\n"), cap.err
    assert _contents(run, sweep) == before


def test_slurm_render_still_writes_elsewhere(results, capsys, tmp_path):
    out = tmp_path / "job.sbatch"
    code, cap = run_cli(["slurm", "render", "--cpu", "--out", str(out), "strategy=ddp"], capsys)
    assert code == 0 and out.read_text().startswith("#!"), cap.err

"""`scalelab compare` / `aggregate` across sweeps and however their paths are given (walkthrough
of the results path): two sweeps in folders of one name keep their own efficiencies and rows that
tell them apart; efficiency is there for a sweep's parent folder or some of its job folders;
overlapping paths count a run once; --out never replaces a record being read; --where takes the
value the table shows; `aggregate` of a job folder is refused. Hand-made run records (expected
efficiencies computed by hand: thr(N) / (N x thr(1))), no training."""
from __future__ import annotations

import json

import pytest

from scalelab.cli import main
from scalelab.results.record import write_json

from .test_report import _rec


def _sweep(folder, thrs, lr=0.001):
    """FOLDER as a multirun sweep of ddp batch 16 at world 1, 2, ...: throughputs THRS, job names
    `<folder name>/<i>` as train.py names them, Hydra's multirun.yaml in it."""
    folder.mkdir(parents=True)
    (folder / "multirun.yaml").write_text("hydra: {}\n")
    for i, thr in enumerate(thrs):
        (folder / str(i)).mkdir()
        write_json(folder / str(i) / "run.json", _rec(i, "ddp", i + 1, 16, thr, lr=lr, job={
            "name": f"{folder.name}/{i}", "sweep_dir": str(folder.resolve()), "group": folder.name}))
    return folder


@pytest.fixture()
def two(tmp_path):
    """A/sw: 100 then 150 samples/s at 2 ranks (150 / 200 = 0.75); B/sw: 100 then 60 (60 / 200 = 0.30)."""
    return _sweep(tmp_path / "A" / "sw", [100.0, 150.0]), _sweep(tmp_path / "B" / "sw", [100.0, 60.0])


def _run(argv, capsys):
    with pytest.raises(SystemExit) as done:
        main(argv)
    out = capsys.readouterr()
    return done.value.code, out.out, out.err


def _eff(argv, capsys) -> dict:
    """{record_path: efficiency} of `scalelab compare ARGV --format json`."""
    code, out, err = _run(["compare", *argv, "--format", "json"], capsys)
    assert code == 0, err
    return {r["job"]["record_path"]: r.get("scaling_efficiency") for r in json.loads(out)}


def test_two_sweeps_named_alike_keep_their_own_efficiency(two, capsys):
    a, b = two
    eff = _eff([str(a), str(b)], capsys)
    # before: A's sw/1 showed 0.30, B's (the last summary applied to every record named sw/1)
    assert eff == pytest.approx({f"{a}/0/run.json": 1.0, f"{a}/1/run.json": 0.75,
                                 f"{b}/0/run.json": 1.0, f"{b}/1/run.json": 0.30})
    code, out, _ = _run(["compare", str(a), str(b), "--format", "markdown"], capsys)
    jobs = [line.split("|")[1].strip() for line in out.splitlines()[2:] if line.startswith("|")]
    assert sorted(jobs) == ["A/sw/0", "A/sw/1", "B/sw/0", "B/sw/1"]     # before: sw/0, sw/0, sw/1, sw/1


def test_a_renamed_copy_of_a_sweep_is_labelled_by_its_own_folders(tmp_path, capsys):
    """`cp -r sweepA sweepB`: B's records keep the job names sweepA/0, sweepA/1. Their rows read
    "sweepA/0 [0]": the copy's last folder only, which said nothing of which copy (review)."""
    import shutil

    a = _sweep(tmp_path / "sweepA", [100.0, 150.0])
    shutil.copytree(a, tmp_path / "sweepB")
    code, out, err = _run(["compare", str(a), str(tmp_path / "sweepB"), "--format", "markdown"], capsys)
    jobs = [line.split("|")[1].strip() for line in out.splitlines()[2:] if line.startswith("|")]
    assert code == 0 and sorted(jobs) == ["sweepA/0", "sweepA/0 [sweepB/0]", "sweepA/1", "sweepA/1 [sweepB/1]"], err


def test_one_sweep_keeps_its_short_job_names(two, capsys):
    code, out, _ = _run(["compare", str(two[0]), "--format", "markdown"], capsys)
    assert [line.split("|")[1].strip() for line in out.splitlines()[2:] if line.startswith("|")] == ["sw/0", "sw/1"]


def test_efficiency_of_a_parent_folder_and_of_job_folders(two, tmp_path, capsys):
    a, b = two
    eff = _eff([str(tmp_path)], capsys)                     # before: no efficiency at all
    assert eff == pytest.approx({f"{a}/0/run.json": 1.0, f"{a}/1/run.json": 0.75,
                                 f"{b}/0/run.json": 1.0, f"{b}/1/run.json": 0.30})
    # one job folder of a sweep: its efficiency against its sweep's baseline, as sweep.json has it
    assert _eff([str(a / "1")], capsys) == pytest.approx({f"{a}/1/run.json": 0.75})
    code, out, err = _run(["compare", str(tmp_path), "--sort", "scaling_efficiency", "--format", "json"], capsys)
    assert code == 0, err                                   # before: "no run has this key"
    assert [r["scaling_efficiency"] for r in json.loads(out)] == pytest.approx([0.30, 0.75, 1.0, 1.0])


def test_single_runs_have_no_efficiency(tmp_path, capsys):
    """Runs outside a multirun (job.sweep_dir null) side by side: not a sweep, no efficiency."""
    for i, thr in enumerate([100.0, 150.0]):
        (tmp_path / "runs" / f"r{i}").mkdir(parents=True)
        write_json(tmp_path / "runs" / f"r{i}" / "run.json",
                   _rec(i, "ddp", i + 1, 16, thr, job={"name": f"r{i}", "sweep_dir": None}))
    assert set(_eff([str(tmp_path / "runs" / "r0"), str(tmp_path / "runs" / "r1")], capsys).values()) == {None}


@pytest.mark.parametrize("extra", [["0"], [""], ["0/run.json"]])
def test_overlapping_paths_count_each_run_once(two, capsys, extra):
    a = two[0]
    code, out, _ = _run(["compare", str(a), *(str(a / e) for e in extra), "--format", "json"], capsys)
    assert len(json.loads(out)) == 2                                       # before: 3, 4, 3


@pytest.mark.parametrize("out", ["0/run.json", "sweep.json", "1/sweep.json"])
def test_out_never_replaces_a_record_being_read(two, capsys, out):
    a = two[0]
    before = (a / "0" / "run.json").read_text()
    code, stdout, err = _run(["compare", str(a), "--format", "csv", "--out", str(a / out)], capsys)
    assert code == 2 and err.count("\n") == 1 and str(a / out) in err and str(a) in err, err
    assert (a / "0" / "run.json").read_text() == before and not (a / "sweep.json").exists()


def test_out_refuses_the_record_given_as_a_file_and_allows_other_names(two, capsys):
    rec = two[0] / "0" / "run.json"
    code, _, err = _run(["compare", str(rec), "--format", "csv", "--out", str(rec)], capsys)
    assert code == 2 and "is one of the inputs" in err and err.count("\n") == 1
    code, _, err = _run(["compare", str(two[0]), "--format", "csv", "--out", str(two[0] / "table.csv")], capsys)
    assert code == 0 and (two[0] / "table.csv").read_text().startswith("status,")


def test_where_takes_the_float_the_table_shows(tmp_path, capsys):
    a = _sweep(tmp_path / "sw", [100.0, 150.0], lr=0.0042371)
    code, out, _ = _run(["compare", str(a), "--format", "markdown"], capsys)
    assert "| 0.00424 |" in out                                        # what the table shows
    for want in ("0.00424", "0.0042371"):                              # as shown; exact
        code, out, err = _run(["compare", str(a), "--where", f"lr={want}", "--format", "json"], capsys)
        assert code == 0 and len(json.loads(out)) == 2, (want, err)   # before: 0.00424 matched nothing
    for want in ("0.00425", "0.0042", "4.24e-3"):     # neither equal nor the table's text
        code, _, err = _run(["compare", str(a), "--where", f"lr={want}"], capsys)
        assert code == 2 and err == f"error: no run matches lr={want}: lr is 0.0042371\n", err
    code, out, _ = _run(["compare", str(a), "--where", "world_size=2", "--format", "json"], capsys)
    assert [r["world_size"] for r in json.loads(out)] == [2]           # integers: exact as before


def test_aggregate_refuses_a_job_folder(two, capsys):
    job = two[0] / "0"
    code, out, err = _run(["aggregate", str(job)], capsys)
    # before: exit 0, sweep.json and report.html written beside the job's run.json
    assert code == 2 and err.count("\n") == 1 and str(job) in err and "sweep folder" in err
    assert str(two[0].resolve()) in err
    assert sorted(p.name for p in job.iterdir()) == ["run.json"]


def test_efficiency_chart_of_two_sweeps_named_alike_draws_each_sweeps_selected_runs(two):
    """A's 2-rank job alone and all of B: A's series is its one selected point; before, A's group
    found B's job "sw/0" by name and drew a 1-rank point for a run that was not selected."""
    from scalelab.results import charts
    from scalelab.results.record import read_records
    from scalelab.results.sweep import aggregate, attach_efficiency

    a, b = two
    recs = read_records([a / "1", b])
    sums = [aggregate(a, write=False), aggregate(b, write=False)]
    for s in sums:
        attach_efficiency(recs, s)
    ch = charts.efficiency(sums, recs, "strong")
    assert {t["name"]: (t["x"], t["y"]) for t in ch["traces"]} == {
        "A/sw: ddp b16": ([2], [pytest.approx(0.75)]), "B/sw: ddp b16": ([1, 2], [1.0, pytest.approx(0.30)]),
        "ideal": ([1, 2], [1.0, 1.0])}


def test_re_aggregating_a_sweep_resumes_its_one_w_and_b_summary_run(two, tmp_path, wandb_env):
    """A rerun into the same sweep dir or `scalelab aggregate DIR --wandb offline` logs into the
    summary run sweep.json names (offline: another offline-run-*-ID folder of the same ID); before,
    each aggregation made a new run (a new id) and sweep.json forgot the first."""
    from scalelab.results.callbacks import summarize_sweep
    from scalelab.results.wandb_offline import find_runs, read_run

    a = two[0]
    logger = {"name": "wandb", "mode": "offline", "project": "scalelab-test"}
    first = summarize_sweep(a, logger, str(tmp_path / "cache"))["wandb_run_id"]
    second = summarize_sweep(a, logger, str(tmp_path / "cache"))["wandb_run_id"]
    assert first and second == first
    assert json.loads((a / "sweep.json").read_text())["wandb_run_id"] == first
    ids = [read_run(p)["run"]["run_id"] for p in find_runs(a / "wandb")]
    assert ids == [first, first]


def test_aggregate_refuses_a_parent_of_sweeps(two, tmp_path, capsys):
    """`aggregate outputs/sweeps` pooled every sweep under it: the same config of two sweeps made one
    scaling group against one baseline (A's and B's 2-rank runs both against one 1-rank run)."""
    code, out, err = _run(["aggregate", str(tmp_path)], capsys)
    assert code == 2 and err.count("\n") == 1 and "holds 2 sweep(s), not one" in err, err
    assert str(two[0]) in err and str(two[1]) in err
    assert not (tmp_path / "sweep.json").exists() and not (tmp_path / "report.html").exists()
    code, out, err = _run(["aggregate", str(two[0])], capsys)          # a sweep's own folder still works
    assert code == 0 and (two[0] / "sweep.json").exists()


def test_an_empty_path_is_refused_not_read_as_the_current_folder(two, capsys, monkeypatch):
    # `scalelab compare "$SWEEP"` with SWEEP unset: Path("") is ".", which compared (or aggregated,
    # rewriting its sweep.json) whatever the current folder held
    monkeypatch.chdir(two[0])
    for argv in (["compare", ""], ["compare", str(two[1]), " "], ["aggregate", ""]):
        code, out, err = _run(argv, capsys)
        assert code == 2 and out == "" and err.count("\n") == 1 and "'' is an empty path" in err, (argv, err)
    assert not (two[0] / "sweep.json").exists()


def test_aggregate_of_a_record_file_names_its_sweep_folder(two, capsys):
    record = two[0] / "1" / "run.json"
    code, _, err = _run(["aggregate", str(record)], capsys)
    # before: "…/run.json holds no run.json"
    assert code == 2 and err == (f"error: {record} is a file, not a sweep folder: give its sweep folder (e.g. "
                                 f"{two[0].resolve()}), or scalelab compare {record}\n"), err


def test_aggregate_of_a_sweep_whose_runs_all_failed_exits_1_saying_so(tmp_path, capsys):
    sw = tmp_path / "sw"
    _sweep(sw, [0.0, 0.0])
    for i in range(2):
        rec = json.loads((sw / str(i) / "run.json").read_text())
        rec.update(status="failed", error="boom")
        write_json(sw / str(i) / "run.json", rec)
    code, out, err = _run(["aggregate", str(sw)], capsys)
    # before: exit 0, an empty groups list: a script could not tell it from an aggregated sweep
    assert code == 1 and err == f"error: no completed run in {sw} (2 failed): no scaling efficiency\n", err
    assert "0 completed, 2 failed" in out and json.loads((sw / "sweep.json").read_text())["groups"] == []


@pytest.fixture()
def wandb_settings_read_anew():
    """W&B reads its settings (WANDB_INIT_TIMEOUT, WANDB_BASE_URL) once per process: an earlier
    test's were kept, and this test's would be kept for the next one."""
    import wandb

    wandb.teardown()
    yield
    wandb.teardown()


def test_an_online_summary_that_cannot_connect_is_logged_offline_also_when_resumed(two, tmp_path, wandb_env,
                                                                                  monkeypatch, capsys,
                                                                                  wandb_settings_read_anew):
    """Review 2026-12-04: a rerun of an online sweep with no network (the summary run's id stored in
    sweep.json) retried offline with the id W&B's service still held ("run ID ... is in use"): no
    table, no report.html, an empty offline-run folder. Now: the same run offline (a new service),
    with one warning line, then the table and the report; and a W&B failure never costs the table
    or the report."""
    from scalelab.results import wandb_summary
    from scalelab.results.callbacks import summarize_sweep
    from scalelab.results.wandb_offline import find_runs, read_run

    monkeypatch.setenv("WANDB_API_KEY", "0123456789abcdef" * 2 + "01234567")
    monkeypatch.setenv("WANDB_BASE_URL", "http://127.0.0.1:9")   # discard port: connection refused
    monkeypatch.setenv("WANDB_INIT_TIMEOUT", "5")
    a = two[0]
    offline = {"name": "wandb", "mode": "offline", "project": "p"}
    first = summarize_sweep(a, offline, str(tmp_path / "cache"))["wandb_run_id"]
    (a / "report.html").unlink()
    capsys.readouterr()
    second = summarize_sweep(a, {**offline, "mode": "online"}, str(tmp_path / "cache"))["wandb_run_id"]
    out = capsys.readouterr()
    assert out.out.count("W&B online init failed") == 1 and "the sweep summary is logged offline" in out.out, out
    assert "== sweep" in out.out and (a / "report.html").exists()
    assert second == first and json.loads((a / "sweep.json").read_text())["wandb_run_id"] == first
    runs = find_runs(a / "wandb")   # two aggregations of one summary run, each a finished offline run
    assert [read_run(p)["run"]["run_id"] for p in runs] == [first, first]
    assert [read_run(p)["exit_code"] for p in runs] == [0, 0]
    assert all(list(d.glob("*.wandb")) for d in (a / "wandb").glob("offline-run-*"))   # no empty one to sync

    def broken(*args, **kwargs):
        raise RuntimeError("service died\nsecond line")

    monkeypatch.setattr(wandb_summary, "log_sweep", broken)
    (a / "report.html").unlink()
    summary = summarize_sweep(a, offline, str(tmp_path / "cache"))
    out = capsys.readouterr()
    assert out.err.count("\n") == 1 and "the sweep summary was not logged to W&B (RuntimeError: service died)" \
        in out.err, out.err
    assert "== sweep" in out.out and (a / "report.html").exists() and summary["num_completed"] == 2
    assert json.loads((a / "sweep.json").read_text())["wandb_run_id"] == first   # kept for the next aggregation


def test_aggregate_logs_the_summary_run_to_the_project_its_jobs_logged_to(tmp_path, wandb_env, capsys):
    """Review 2026-12-04: `scalelab aggregate DIR --wandb offline` put the summary run in project
    `scalelab` (--project's default) while the sweep's jobs and its first summary were in theirs."""
    from scalelab.results.wandb_offline import find_runs, read_run

    sw = _sweep(tmp_path / "sw", [100.0, 150.0])
    for rec_path in sw.glob("*/run.json"):
        rec = json.loads(rec_path.read_text())
        rec["config"]["logger"] = {"name": "wandb", "project": "myproj", "entity": None}
        write_json(rec_path, rec)
    code, out, err = _run(["aggregate", str(sw), "--wandb", "offline"], capsys)
    assert code == 0, err
    code, out, err = _run(["aggregate", str(sw), "--wandb", "offline", "--project", "other"], capsys)
    assert code == 0, err
    projects = sorted(read_run(p)["run"]["project"] for p in find_runs(sw / "wandb"))
    assert projects == ["myproj", "other"]

"""A run's sweep is the folder its record names (job.sweep_dir) where that is above its job folder,
however the runs are given and whatever the folders are called; a single run (job.sweep_dir null)
has no sweep and no efficiency; a run.json away from its sweep reads no other folder. `aggregate`
refuses a folder whose records name several sweeps or none. Hand-made records; efficiencies by
hand: thr(N) / (N x thr(1))."""
from __future__ import annotations

import json
from pathlib import Path

import pytest

from scalelab.results.record import write_json

from .test_compare_sweeps import _eff, _run
from .test_report import _rec


def _task(folder: Path, sweep: Path | None, num: int, world: int, thr: float):
    """A job folder as train.py writes it: an array task / multirun job of SWEEP, or a single run."""
    folder.mkdir(parents=True)
    group = sweep.name if sweep else folder.name
    write_json(folder / "run.json", _rec(num, "ddp", world, 16, thr, job={
        "name": f"{group}/{num}" if sweep else group, "group": group, "dir": str(folder.resolve()),
        "sweep_dir": str(sweep.resolve()) if sweep else None, "num": num}))


@pytest.fixture()
def slurm(tmp_path):
    """outputs/slurm as `scalelab slurm submit --array` and `submit --wait` leave it: arrays 100-a
    (200, then 300 at 2 ranks: 300 / 400 = 0.75) and 101-b (100, then 120: 120 / 200 = 0.60), each
    task in <array>/<task>, no multirun.yaml; and a single run 102-c (1600 samples/s at 2 ranks)."""
    root = tmp_path / "outputs" / "slurm"
    for name, thrs in (("100-a", (200.0, 300.0)), ("101-b", (100.0, 120.0))):
        for i, thr in enumerate(thrs):
            _task(root / name / str(i), root / name, i, i + 1, thr)
    _task(root / "102-c", None, 0, 2, 1600.0)
    (root / "101-b.out").write_text("sbatch log\n")
    return root


EXPECTED = {"100-a/0": 1.0, "100-a/1": 0.75, "101-b/0": 1.0, "101-b/1": 0.60, "102-c": None}


def _by_run(eff: dict, root: Path) -> dict:
    return {str(Path(k).parent.relative_to(root)): v for k, v in eff.items()}


@pytest.mark.parametrize("given", [[""], ["101-b"], ["101-b/1"], ["102-c"], ["101-b", "102-c"],
                                   ["102-c/run.json", "100-a/1/run.json"]])
def test_efficiency_is_the_recorded_sweeps_whatever_folder_is_named(slurm, capsys, given):
    eff = _by_run(_eff([str(slurm / g) for g in given], capsys), slurm)
    # before, `compare outputs/slurm` pooled all three (the named folder was everyone's sweep):
    # 101-b/1 0.30 against 100-a's baseline, the single run 4.00
    assert eff == pytest.approx({k: EXPECTED[k] for k in eff})


def test_single_runs_in_a_named_folder_have_no_efficiency(tmp_path, capsys):
    runs = tmp_path / "outputs" / "runs"
    _task(runs / "r0", None, 0, 1, 100.0)
    _task(runs / "r1", None, 0, 2, 150.0)
    assert _by_run(_eff([str(runs)], capsys), runs) == {"r0": None, "r1": None}   # before: 1.0, 0.75


def test_a_moved_sweep_keeps_its_efficiency_and_nested_job_folders_count(tmp_path, capsys):
    """The sweep recorded at /elsewhere/sw, now under moved/sw; Hydra subdirs two levels deep."""
    sw = tmp_path / "moved" / "sw"
    for i, thr in enumerate((100.0, 150.0)):
        _task(sw / f"lr={i}" / str(i), sw, i, i + 1, thr)
    for f in sw.rglob("run.json"):
        rec = json.loads(f.read_text())
        rec["job"]["sweep_dir"] = "/elsewhere/sw"
        write_json(f, rec)
    eff = _by_run(_eff([str(tmp_path / "moved")], capsys), sw)
    assert eff == pytest.approx({"lr=0/0": 1.0, "lr=1/1": 0.75})


def test_a_run_json_away_from_its_sweep_reads_no_other_folder(tmp_path, capsys, monkeypatch):
    """~/Downloads/run.json, a job of a sweep elsewhere: compared alone, without an efficiency;
    before, its folder's parent (all of $HOME) was aggregated, and corrupt files there were read."""
    home = tmp_path / "home"
    _task(home / "sweep" / "1", home / "sweep", 1, 2, 150.0)
    (home / "Downloads").mkdir()
    (home / "Downloads" / "run.json").write_text((home / "sweep" / "1" / "run.json").read_text())
    (home / "junk" / "0").mkdir(parents=True)
    (home / "junk" / "0" / "run.json").write_text("{not json")
    walked = []
    rglob = Path.rglob
    monkeypatch.setattr(Path, "rglob", lambda self, pat: walked.append(self) or rglob(self, pat))
    code, out, err = _run(["compare", str(home / "Downloads" / "run.json"), "--format", "json"], capsys)
    assert code == 0 and err == "", err
    assert [r.get("scaling_efficiency") for r in json.loads(out)] == [None]
    assert walked == []


def test_aggregate_refuses_single_runs_and_several_sweeps(slurm, tmp_path, capsys):
    code, out, err = _run(["aggregate", str(slurm)], capsys)   # before: exit 0, all pooled, sweep.json written
    assert code == 2 and err.count("\n") == 1 and "runs of 2 sweeps, not one" in err, err
    assert str((slurm / "100-a").resolve()) in err and str((slurm / "101-b").resolve()) in err
    assert not (slurm / "sweep.json").exists()
    runs = tmp_path / "runs"
    _task(runs / "r0", None, 0, 1, 100.0)
    _task(runs / "r1", None, 0, 2, 150.0)
    code, out, err = _run(["aggregate", str(runs)], capsys)    # before: exit 0, 0.75 for an unrelated run
    assert code == 2 and err.count("\n") == 1 and "single runs only" in err, err
    assert not (runs / "sweep.json").exists()
    code, out, err = _run(["aggregate", str(slurm / "101-b")], capsys)
    assert code == 0 and json.loads((slurm / "101-b" / "sweep.json").read_text())["num_runs"] == 2


def test_aggregate_of_a_job_folder_names_its_own_sweep_or_says_it_has_none(slurm, capsys):
    code, out, err = _run(["aggregate", str(slurm / "101-b" / "1")], capsys)
    assert code == 2 and err.count("\n") == 1 and err.rstrip().endswith(f"give its sweep folder, {(slurm / '101-b').resolve()}")
    code, out, err = _run(["aggregate", str(slurm / "102-c")], capsys)
    # before: "give its sweep folder, e.g. outputs/slurm" (a folder of other runs)
    assert code == 2 and err.count("\n") == 1 and "single run, with no sweep" in err and str(slurm) + "\n" not in err, err


def test_aggregate_of_a_parent_of_one_sweep_names_that_sweep(tmp_path, capsys):
    from .test_compare_sweeps import _sweep

    sw = _sweep(tmp_path / "sweeps" / "sw", [100.0, 150.0])
    code, out, err = _run(["aggregate", str(tmp_path / "sweeps")], capsys)
    # before: "holds 1 sweep(s), not one"
    assert code == 2 and err == f"error: {tmp_path / 'sweeps'} is not a sweep folder: aggregate the sweep it holds, {sw}\n"

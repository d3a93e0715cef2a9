"""Output paths a command cannot write are one line, exit 2, before any work: a file where a folder
must be (--out under a file; hydra.run.dir/hydra.sweep.dir under a file), a folder where the file
must be. Before: NotADirectoryError / IsADirectoryError tracebacks (compare, slurm render, k8s),
Hydra's traceback (scalelab-train), after the work was done. Missing parent folders are created."""
import pytest

from scalelab.errors import ConfigError
from scalelab.paths import path_problem
from scalelab.preflight import preflight
from scalelab.results.record import write_json

from .test_results import _rec
from ..conftest import run_cli as _run


@pytest.fixture()
def a_file(tmp_path):
    f = tmp_path / "afile"
    f.write_text("x")
    return f


def test_path_problem_names_the_file_in_the_way(tmp_path, a_file):
    assert path_problem(a_file / "x.csv", "--out") == f"--out {a_file / 'x.csv'} cannot be created: {a_file} is a file, not a folder"
    assert path_problem(tmp_path, "--out") == f"--out {tmp_path} is a folder: give a file path"
    assert path_problem(a_file, "--log-dir", folder=True) == f"--log-dir {a_file} is a file: give a folder path"
    assert path_problem(tmp_path / "new" / "deeper" / "x.csv", "--out") is None      # created when written
    assert path_problem(tmp_path / "new", "--log-dir", folder=True) is None


def test_compare_slurm_and_k8s_refuse_an_unwritable_out_in_one_line(tmp_path, a_file, capsys):
    run = tmp_path / "run"
    run.mkdir()
    write_json(run / "run.json", _rec("r", "ddp", 2, 16, 100.0))
    for argv in (["compare", str(run), "--format", "csv", "--out", str(a_file / "x.csv")],
                 ["slurm", "render", "--cpu", "--out", str(a_file / "job.sbatch"), "strategy=ddp"],
                 ["recommend", "--model", "gpt_nano", "--devices", "2", "--hardware", "this_cpu",
                  "--out", str(a_file / "rec")],
                 ["k8s", "render", "--cpu", "--nodes", "2", "--devices", "1", "--image", "scalelab:1",
                  "--out", str(a_file / "job.yaml"), "strategy=ddp"]):
        code, out = _run(argv, capsys)
        out_path = argv[argv.index("--out") + 1]
        assert (code, out.err) == (2, f"error: --out {out_path} cannot be created: {a_file} is a file, not a folder\n")
    code, out = _run(["compare", str(run), "--format", "csv", "--out", str(tmp_path / "made" / "x.csv")], capsys)
    assert code == 0 and (tmp_path / "made" / "x.csv").read_text().startswith("status,")


def test_a_run_or_sweep_dir_under_a_file_is_one_line_before_any_job(a_file):
    with pytest.raises(ConfigError, match=rf"^hydra.run.dir {a_file}/run cannot be created: {a_file} is a file"):
        preflight([f"hydra.run.dir={a_file / 'run'}"], data=False)
    with pytest.raises(ConfigError, match=rf"hydra.sweep.dir/subdir\) {a_file}/sw/0 cannot be created"):
        preflight(["-m", "strategy=single,ddp", f"hydra.sweep.dir={a_file / 'sw'}"], data=False)

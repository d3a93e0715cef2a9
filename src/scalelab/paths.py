"""Where the project's config, experiments and caches live."""
from __future__ import annotations

import os
import tempfile
from pathlib import Path

# src/scalelab/paths.py -> repo root (the project is installed editable; see Makefile).
REPO_ROOT = Path(__file__).resolve().parents[2]


def command(name: str) -> str:
    """How to run this environment's console script NAME (scalelab, scalelab-train) from here, for a
    line to copy: NAME where PATH finds this one, else its path (.venv/bin/scalelab from a checkout:
    the bare name printed after `make run` was 'command not found' without an activated venv)."""
    import shutil
    import sys

    script = Path(sys.executable).parent / name
    found = shutil.which(name)
    if not script.exists() or (found and Path(found).resolve() == script.resolve()):
        return name
    if os.environ.get("MAKELEVEL"):   # make -C DIR: the user's shell is not in make's folder
        return str(script)
    try:
        return str(script.relative_to(Path.cwd()))
    except (ValueError, OSError):     # elsewhere, or the working folder is gone
        return str(script)


def wandb_dirs(cache: Path) -> dict[str, str]:
    """W&B's cache, settings and data folders under scalelab's cache folder CACHE."""
    return {"WANDB_CACHE_DIR": str(Path(cache) / "wandb-cache"), "WANDB_CONFIG_DIR": str(Path(cache) / "wandb-config"),
            "WANDB_DATA_DIR": str(Path(cache) / "wandb-data")}


def default_wandb_env(cache: Path | None) -> None:
    """This process's own W&B runs (a sweep's summary, a failed job's amendment) keep W&B's folders
    where the ranks keep them (launch.rank_env), unless the environment names others; quiet."""
    for var, value in (wandb_dirs(cache) if cache is not None else {}).items():
        os.environ.setdefault(var, value)
    os.environ.setdefault("WANDB_SILENT", "true")


def conf_dir() -> Path:
    return Path(os.environ.get("SCALELAB_CONF_DIR", REPO_ROOT / "conf")).resolve()


def cache_dir() -> Path:
    """Prepared datasets and JIT-built ops; override with SCALELAB_CACHE."""
    default = Path(os.environ.get("XDG_CACHE_HOME", Path.home() / ".cache")) / "scalelab"
    return Path(os.environ.get("SCALELAB_CACHE", default)).resolve()


def path_problem(path: str | Path, what: str, folder: bool = False) -> str | None:
    """Why `path` cannot be written as `what` (a file, or a folder with `folder`), one line; None
    where it can. Missing parent folders are fine (they are created); a file where a folder must
    be, a folder where the file must be, or a folder this user cannot write is not: it raised
    NotADirectoryError / IsADirectoryError / PermissionError tracebacks after the work was done."""
    p = Path(path)   # as the caller writes it (a shell expands ~ before we see it)
    if p.exists() and p.is_dir() != folder:
        return f"{what} {path} is {'a file' if folder else 'a folder'}: give {'a folder' if folder else 'a file'} path"
    if p.exists() and not os.access(p, os.W_OK):
        return f"{what} {path} cannot be written: no write permission"
    parent = p if folder and p.exists() else p.parent
    while not parent.exists() and parent != parent.parent:
        parent = parent.parent
    if not parent.is_dir():
        return f"{what} {path} cannot be created: {parent} is a file, not a folder"
    if not os.access(parent, os.W_OK | os.X_OK):
        return f"{what} {path} cannot be written: no write permission in {parent}"
    if not p.exists():
        # write permission says nothing for root, nor on /proc or /sys (Hydra's own mkdir of a job
        # folder there raised a traceback): a folder made and removed where the path's would go,
        # never the path itself (jobs starting at once, an array's tasks, share parts of it)
        try:
            os.rmdir(tempfile.mkdtemp(prefix=".scalelab-probe-", dir=parent))
        except OSError as e:
            return f"{what} {path} cannot be created: {e.strerror or e}"
    return None


def write_out(path: str | Path, text: str) -> None:
    """Write `text` to `path`, creating its missing parent folders (check path_problem first)."""
    p = Path(path)
    p.parent.mkdir(parents=True, exist_ok=True)
    p.write_text(text)


# What --out must never replace: a job's record and resolved config, a sweep's summary and Hydra's
# sweep config (`slurm render --out RUN/run.json` replaced a record with a script, exit 0).
CONFIG_FILE = "config_resolved.yaml"  # JOB_DIR/config_resolved.yaml: the resolved config the ranks read
RECORD_NAMES = ("run.json", "sweep.json", CONFIG_FILE, "multirun.yaml")
# What marks a sweep's folder (Hydra's multirun.yaml, aggregation's sweep.json) and a single run's
# (its record, or the resolved config it writes before any rank); a job's folder also by Hydra's
# .hydra. One list each for job_dir's refusals, the --out guard and results.sweep.
SWEEP_MARKS = ("multirun.yaml", "sweep.json")
REPORT_FILE = "report.html"  # SWEEP_DIR/report.html: the sweep's dashboard, rewritten by `scalelab aggregate`
RUN_MARKS = ("run.json", CONFIG_FILE)
JOB_MARKS = (*RUN_MARKS, ".hydra")


def overwrites_input(path: str | Path, inputs: list[str | Path], what: str = "--out") -> str | None:
    """Why writing `path` would destroy what is being read, one line; None where it would not: it
    is one of INPUTS (a run.json given as such), or a record inside an input folder
    (`compare SWEEP --out SWEEP/0/run.json` replaced that run's record with the CSV of the table)."""
    out = Path(path).resolve()
    for given in map(Path, inputs):
        src = given.resolve()
        if out == src:
            return f"{what} {path} is one of the inputs ({given}): give another file"
        if src.is_dir() and out.name in RECORD_NAMES and out.is_relative_to(src):
            return (f"{what} {path} would overwrite a {out.name} inside the input folder {given}: give a file "
                    f"not named {', '.join(RECORD_NAMES)} there")
    return None


def _results_folder(folder: Path) -> tuple[str, Path] | None:
    """("job" | "sweep", the folder) for the nearest job or sweep folder at or above `folder`."""
    for f in (folder, *folder.parents):
        if any((f / m).exists() for m in JOB_MARKS) or f.name == ".hydra":
            return "job", f
        if any((f / m).is_file() for m in SWEEP_MARKS):
            return "sweep", f
    return None


def out_problem(path: str | Path, what: str = "--out", inputs: list[str | Path] = ()) -> str | None:
    """Why an --out of any command must not be written at `path`, one line; None where it may.
    Every --out goes through here so that no command replaces what runs recorded: a file named as a
    record (RECORD_NAMES) that exists, any path inside a job folder (everything there is the job's:
    its record, config, logs, checkpoints), a record name or a subfolder's file inside a sweep folder
    (its jobs, its slurm/ scripts and ids); a new file directly in a sweep folder is fine (a table
    beside its report.html). INPUTS (overwrites_input) first, then whether it can be written (path_problem)."""
    given = overwrites_input(path, inputs, what)
    if given:
        return given
    p = Path(path)
    choose = "choose a path outside run and sweep folders"
    for name in {p.name, p.resolve().name} & set(RECORD_NAMES):
        if p.exists():
            return f"{what} {path} is an existing {name}, a run or sweep record: {choose}"
    found = _results_folder(p.resolve().parent)
    if found and (found[0] == "job" or p.name in RECORD_NAMES or p.resolve().parent != found[1]):
        return f"{what} {path} is inside the {found[0]} folder {found[1]}: writing there could replace its records; {choose}"
    if found and p.name == REPORT_FILE and p.exists():
        # `compare SWEEP OTHER --out SWEEP/report.html` replaced the sweep's own dashboard (found by review)
        return (f"{what} {path} is the sweep's own dashboard (scalelab aggregate {found[1]} writes it): "
                f"give another name, e.g. {found[1] / 'compare.html'}")
    return path_problem(path, what)

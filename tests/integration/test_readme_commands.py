"""Every command block of the README runs as written: the cheap ones are run (training with few
steps), sweeps are expanded and validated job by job, and the long or network ones are named
with the reason they are not run here. A new README command that no rule covers fails."""
from __future__ import annotations

import re
import shlex
import subprocess
import sys
from pathlib import Path

import pytest

from ..conftest import REPO, env

pytestmark = pytest.mark.integration
BIN = Path(sys.executable).parent


def readme_commands() -> list[str]:
    out = []
    for block in re.findall(r"```bash\n(.*?)```", (REPO / "README.md").read_text(), re.S):
        cmd = ""
        for line in block.splitlines():
            line = "" if line.lstrip().startswith("#") else line.split("  #")[0].rstrip()
            if line.endswith("\\"):
                cmd += line[:-1] + " "
            elif line:
                out.append(" ".join((cmd + line).split()))
                cmd = ""
    return out


# (pattern, action): run = as written (few steps for training), sweep = expand and validate every
# job, skip = not here, with why.
RULES = [
    (r"^make (run|test)$", "skip: the quick start itself; CI runs `make test`, and the default sweep's jobs are "
                           "the core sweep of tests/integration/test_core_sweep.py"),
    (r"^\.venv/bin/scalelab-train -m ", "sweep"),
    (r"^\.venv/bin/scalelab-train ", "run"),
    (r"^\.venv/bin/scalelab (compare|plan --layers|plan strategy=|plan --params)", "run"),
    (r"^scripts/plan_sweep\.sh", "passes"),
    (r"^\.venv/bin/scalelab plan --(calibrate|validate)",
     "skip: reads the planner's calibration and validation sweeps, which take about 95 minutes"),
]


def _rule(cmd: str) -> str:
    for pattern, action in RULES:
        if re.search(pattern, cmd):
            return action
    raise AssertionError(f"README command with no rule in {__file__}: {cmd}")


def test_every_readme_command_has_a_rule():
    cmds = readme_commands()
    assert len(cmds) >= 10
    for cmd in cmds:
        _rule(cmd)


@pytest.fixture(scope="module")
def workdir(tmp_path_factory):
    return tmp_path_factory.mktemp("readme")


def _argv(cmd: str, workdir: Path, run_dir: Path) -> list[str]:
    argv = shlex.split(cmd.replace("outputs/sweeps/<time>", str(run_dir)).replace("outputs/sweeps/*", str(run_dir)))
    argv[0] = str(BIN / Path(argv[0]).name)
    if argv[0].endswith("scalelab-train") and "--cfg" not in argv:
        argv = [a for a in argv if not a.startswith("trainer.max_steps=")]
        argv += ["trainer.max_steps=8", "trainer.warmup_steps=2", "logger=none", "trainer.enable_progress_bar=false",
                 f"hydra.run.dir={run_dir / 'job'}"]
    return argv


@pytest.mark.parametrize("cmd", [c for c in readme_commands() if _rule(c) == "run"],
                         ids=lambda c: c[:70])
def test_readme_command_runs(cmd, workdir):
    run_dir = workdir / "run"
    argv = _argv(cmd, workdir, run_dir)
    if "compare" in argv[1:2] and not (run_dir / "job" / "run.json").exists():
        pytest.skip("needs the README's training run first (it ran earlier in this module when selected)")
    proc = subprocess.run(argv, cwd=workdir, env=env(), capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, f"{cmd}\n{proc.stdout[-2000:]}\n{proc.stderr[-2000:]}"
    assert "Traceback" not in proc.stderr
    if "--out" in argv:
        assert (workdir / argv[argv.index("--out") + 1]).stat().st_size > 0


@pytest.mark.parametrize("cmd", [c for c in readme_commands() if _rule(c) == "sweep"], ids=lambda c: c[:70])
def test_readme_sweep_validates_every_job(cmd):
    from scalelab.preflight import preflight

    args = shlex.split(cmd)[1:]
    assert preflight(args) >= 2


@pytest.mark.parametrize("cmd", [c for c in readme_commands() if _rule(c) == "passes"], ids=lambda c: c[:70])
def test_readme_planner_sweep_script_validates_every_job_of_every_pass(cmd):
    """The script's passes (DRY_RUN=1 prints them) validated job by job: plan_calibration sweeps no
    seed, and the script's `hydra.sweeper.params.seed=` made the README's command fail at once."""
    from scalelab.preflight import preflight

    proc = subprocess.run(["bash", *shlex.split(cmd)], cwd=REPO, env={**env(), "DRY_RUN": "1"}, capture_output=True,
                          text=True, timeout=60)
    passes = proc.stdout.splitlines()
    assert proc.returncode == 0 and len(passes) >= 2, proc.stderr
    for line in passes:
        args = shlex.split(line)
        assert args[1] == "-m" and preflight(args[1:]) >= 2, line

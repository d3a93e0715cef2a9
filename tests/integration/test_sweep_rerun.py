"""The same sweep command run again into its folder (after a Ctrl-C or a crash) keeps the jobs that
had completed (no rank starts for them; their records stay byte for byte), resumes the one that
was cut off from its checkpoint, and aggregates all; another sweep into that folder is refused
with one line before any job, leaving every record as it was (scalelab.job_dir)."""
import json
import subprocess

import pytest

from scalelab.errors import ConfigError
from scalelab.preflight import preflight

from ..conftest import FAST, TRAIN, env

pytestmark = pytest.mark.integration


def _run(args, cwd):
    return subprocess.run(TRAIN + args, cwd=cwd, env=env(), capture_output=True, text=True, timeout=600)


def test_a_rerun_sweep_keeps_completed_jobs_resumes_the_cut_one_and_refuses_another_sweep(tmp_path):
    sweep = tmp_path / "sweep"
    args = ["-m", "strategy=single", "trainer.max_steps=6,12", "checkpoint.every_n_steps=4", "logger=none",
            f"hydra.sweep.dir={sweep}", *FAST]
    first = _run(args, tmp_path)
    assert first.returncode == 0, first.stderr[-3000:]
    # each periodic save's seconds, apart from the step times (job 0: step 4 of 6; job 1: steps 4, 8, 12)
    assert [len(json.loads((sweep / j / "run.json").read_text())["timing"]["checkpoint_saves_s"])
            for j in "01"] == [1, 3]
    # job 1 as a Ctrl-C between steps 8 and 12 leaves it: no record, newest checkpoint at step 8
    (sweep / "1" / "run.json").unlink()
    for p in (sweep / "1" / "checkpoints").glob("step-00000012.ckpt*"):
        p.unlink()
    kept = (sweep / "0" / "run.json").read_bytes()
    ranks_log = (sweep / "0" / "ranks.log").read_bytes()

    again = _run(args, tmp_path)
    assert again.returncode == 0, again.stderr[-3000:]
    out = again.stdout + again.stderr
    assert f"[scalelab] {sweep.name}/0: completed earlier in {sweep / '0'}; record kept, nothing to run" in out
    assert (sweep / "0" / "run.json").read_bytes() == kept
    assert (sweep / "0" / "ranks.log").read_bytes() == ranks_log          # no rank started for job 0
    resumed = json.loads((sweep / "1" / "run.json").read_text())
    assert resumed["status"] == "completed" and resumed["resumed_at_step"] == 8 and resumed["steps"] == 12
    summary = json.loads((sweep / "sweep.json").read_text())
    assert summary["num_completed"] == 2 and summary["num_failed"] == 0

    records = {p: p.read_bytes() for p in sweep.rglob("run.json")}
    # another sweep into this folder, refused by the command's preflight (in this process: the
    # one-line exit 2 of a refusal is the real command's in tests/unit/test_bad_input.py)
    with pytest.raises(ConfigError) as refused:
        preflight([args[0], "strategy=ddp", *args[2:]], data=False)
    assert str(refused.value).startswith(f"{sweep / '0'} holds another job's run "
                                         "(run.json and checkpoints; there vs now: strategy: single vs ddp)")
    assert "\n" not in str(refused.value)
    assert {p: p.read_bytes() for p in sweep.rglob("run.json")} == records

    # a run that started from checkpoint.resume_from, given the same command again: kept, as any
    # completed run of the same job (it was trained again and its record replaced)
    start = sweep / "1" / "checkpoints" / "step-00000008.ckpt"
    cont = ["strategy=single", "trainer.max_steps=12", f"checkpoint.resume_from={start}", "logger=none",
            f"hydra.run.dir={tmp_path / 'cont'}", *FAST]
    assert _run(cont, tmp_path).returncode == 0
    kept = (tmp_path / "cont" / "run.json").read_bytes()
    again = _run(cont, tmp_path)
    assert again.returncode == 0 and "record kept, nothing to run" in again.stdout + again.stderr
    assert (tmp_path / "cont" / "run.json").read_bytes() == kept

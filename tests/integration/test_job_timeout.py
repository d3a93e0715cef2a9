"""trainer.timeout_s: no limit by default (it was 1800 s for the whole job, which ended every
longer run, SLURM jobs with hours of --time included: found by review); when given, the job is
ended at it and fails saying so."""
from __future__ import annotations

import json
import re
import time
from pathlib import Path

import pytest
from hydra import compose, initialize_config_dir

from scalelab.paths import conf_dir
from scalelab.train import job_timeout

from ..conftest import FAST, train

pytestmark = pytest.mark.integration


def test_the_default_is_no_limit():
    with initialize_config_dir(config_dir=str(conf_dir()), version_base="1.3"):
        cfg = compose("train")
    assert cfg.trainer.timeout_s is None and job_timeout(cfg) == float("inf")


def test_a_given_limit_ends_the_job_and_fails_it(tmp_path):
    t0 = time.monotonic()
    proc = train([*FAST, "strategy=ddp", "trainer.devices=2", "trainer.max_steps=1000000", "logger=wandb",
                  "trainer.timeout_s=5", f"hydra.run.dir={tmp_path / 'j'}"], tmp_path, timeout=120, check=False)
    took = time.monotonic() - t0
    rec = json.loads((tmp_path / "j" / "run.json").read_text())
    assert proc.returncode == 1 and rec["status"] == "failed", proc.stderr[-2000:]
    assert rec["error"] == "timed out after trainer.timeout_s=5 s" and 5 < took < 60, (rec["error"], took)
    out = proc.stdout + proc.stderr   # one FAILED line (with the limit), and where the record is
    assert out.count("FAILED: timed out after trainer.timeout_s=5 s") == 1 and ": failed\n" not in out, out[-2000:]
    assert f"results: {tmp_path / 'j' / 'run.json'}" in out, out[-2000:]
    # the ranks the launcher ended print no exception line each (review 2026-12-04: a SIGTERMException
    # per rank and a count of traceback lines read as a crash): ranks.log keeps them
    assert "SIGTERMException" not in out and "not shown here" not in out, out[-2000:]
    assert "SIGTERMException" in (tmp_path / "j" / "ranks.log").read_text()
    # rank 0's W&B run, which the launcher's stop left with no end at all (review 2026-12-04), ends
    # failed saying why: the launcher continues it (a second offline folder that `wandb sync` joins)
    from scalelab.results.wandb_offline import find_runs, read_run

    # (rank 0's own file may still be W&B's header alone: on a loaded host its service had written
    # nothing when the launcher's stop came, as in the review's 1 s case)
    runs = find_runs(tmp_path / "j")
    assert len(runs) == 2 and len({p.name for p in runs}) == 1, runs       # two folders of one run id
    marked = read_run(runs[-1])
    assert marked["run"]["run_id"] == (tmp_path / "j" / ".wandb_run_id").read_text().strip(), marked["run"]
    assert marked["exit_code"] == 1 and marked["summary"]["status"] == "failed", marked
    assert marked["summary"]["error"] == "timed out after trainer.timeout_s=5 s"


def test_a_job_that_checkpoints_says_where_it_goes_on_from_when_its_limit_ends_it(tmp_path):
    """The ranks' own save line at the stop stays on the console (the SIGTERMException lines do not):
    muting the ranks' output at the limit hid where the job goes on from (review 2026-12-04)."""
    job = tmp_path / "j"
    proc = train([*FAST, "strategy=ddp", "trainer.devices=2", "trainer.max_steps=1000000", "logger=none",
                  "trainer.timeout_s=5", "checkpoint.every_n_steps=100000", f"hydra.run.dir={job}"], tmp_path,
                 timeout=120, check=False)
    out = proc.stdout + proc.stderr
    assert proc.returncode == 1 and "FAILED: timed out after trainer.timeout_s=5 s" in out, out[-2000:]
    saved = re.search(r"\[scalelab\] checkpoint (\S+) saved at step (\d+); stopping \(the same command in the same "
                      r"folder goes on from it\)", out)
    assert saved and Path(saved.group(1)).exists() and "SIGTERMException" not in out, out[-2000:]

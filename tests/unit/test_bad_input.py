"""Bad input: one line naming the bad value and what is valid, before any rank starts."""
import subprocess
import sys

import pytest

from scalelab.errors import ConfigError
from scalelab.preflight import preflight

from ..conftest import env, worker_pids


@pytest.mark.parametrize("args,expected", [
    (["strategy=bogus"], r"strategy=bogus is not known: choose one of .*ddp.*single"),
    (["model=gpt_huge"], r"model=gpt_huge is not known: choose one of .*gpt_nano"),
    (["trainer.devices=0"], r"trainer.devices=0 must be an integer >= 1"),
    (["trainer.devices=2", "data.global_batch_size=15"], r"data.global_batch_size=15 does not divide by 2"),
    (["trainer.devices=2", "data.global_batch_size=16", "data.micro_batch_size=3"],
     r"data.global_batch_size=16 does not divide by 2 data-parallel ranks x micro batch 3"),
    (["data=text_files", "data.files=[/no/such/file.txt]"], r"data.files: '/no/such/file.txt' does not exist"),
    (["data=text_files"], r"data.files.*Missing mandatory value"),
    (["strategy=single", "trainer.devices=1", "lr_scaling.rule=cubic"], r"lr_scaling.rule"),
    (["trainer.precision=fp8"], r"trainer.precision='fp8' is not valid: choose one of 32-true"),
    (["trainer.devcies=2"], r"trainer.devcies"),
])
def test_preflight_rejects(args, expected):
    with pytest.raises(ConfigError, match=expected) as e:
        preflight(args)
    assert "\n" not in str(e.value)


def test_sweep_with_one_bad_job_is_rejected_whole():
    with pytest.raises(ConfigError, match=r"strategy=nope is not known"):
        preflight(["-m", "strategy=single,nope", "trainer.devices=1"])
    with pytest.raises(ConfigError, match=r"does not divide by 3.*\[job:"):
        preflight(["-m", "strategy=ddp", "trainer.devices=1,3", "data.global_batch_size=16"])


def test_good_sweep_counts_its_jobs():
    assert preflight(["-m", "strategy=single,ddp", "trainer.devices=1,2"]) == 4
    assert preflight(["-m", "experiment=default"]) == 4


def test_command_line_error_is_one_line_and_spawns_nothing(tmp_path):
    proc = subprocess.run([sys.executable, "-m", "scalelab.train", "-m", "strategy=ddp,bogus",
                           "trainer.devices=1,2"], cwd=tmp_path, env=env(), capture_output=True, text=True)
    assert proc.returncode == 2
    lines = [ln for ln in proc.stderr.splitlines() if ln.strip()]
    assert lines == ["error: strategy=bogus is not known: choose one of ddp, single"] or \
        (len(lines) == 1 and lines[0].startswith("error: strategy=bogus is not known"))
    assert not (tmp_path / "outputs").exists()  # no job ran, nothing written
    assert not worker_pids(tmp_path)

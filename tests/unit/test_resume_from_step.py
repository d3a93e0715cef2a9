"""checkpoint.resume_from at or past trainer.max_steps: one line before any rank (the ranks crashed
with `statistics.StatisticsError: no median for empty data` and a gloo traceback, 37 lines)."""
import json

import pytest

from scalelab.checkpointing import MANIFEST, checkpoint_step, write_step
from scalelab.errors import ConfigError
from scalelab.preflight import preflight


def test_the_step_comes_from_the_manifest_or_the_name(tmp_path):
    periodic = tmp_path / "step-00000060.ckpt"
    periodic.write_bytes(b"x")
    assert checkpoint_step(periodic) == 60                      # its name
    periodic.with_name(periodic.name + MANIFEST).write_text(json.dumps({"step": 61, "files": {}}))
    assert checkpoint_step(periodic) == 61                      # its manifest first
    last = tmp_path / "last.ckpt"
    last.mkdir()                                                # a sharded checkpoint is a folder
    assert checkpoint_step(last) is None
    write_step(last, 40)
    assert checkpoint_step(last) == 40


@pytest.mark.parametrize("max_steps,ok", [(30, False), (60, False), (61, True)])
def test_resume_from_needs_max_steps_past_its_step(tmp_path, max_steps, ok):
    ckpt = tmp_path / "step-00000060.ckpt"
    ckpt.write_bytes(b"x")
    args = ["model=gpt_nano", f"checkpoint.resume_from={ckpt}", f"trainer.max_steps={max_steps}"]
    if ok:
        assert preflight(args, data=False) == 1
        return
    with pytest.raises(ConfigError) as e:
        preflight(args, data=False)
    assert str(e.value) == (f"checkpoint.resume_from='{ckpt}' is at step 60: trainer.max_steps={max_steps} must be "
                            "larger (it counts every step, the resumed ones included)")

"""Ctrl-C of scalelab-train: one line naming the job and how to go on (it printed a 40-line
KeyboardInterrupt traceback through Hydra and the fork server's watch loop)."""
import json

from scalelab.train import _interrupted


def test_the_line_says_how_to_go_on(tmp_path):
    job = tmp_path / "runs" / "r1"
    assert _interrupted(None) == "[scalelab] interrupted (Ctrl-C) before any job started"
    job.mkdir(parents=True)
    assert _interrupted(job) == (f"[scalelab] interrupted (Ctrl-C) in {job}: it saved no checkpoint "
                                 "(checkpoint.every_n_steps=N saves one every N steps)")
    (job / "checkpoints").mkdir()
    for step in (20, 40):   # complete checkpoints: a 1-byte file and its manifest, as the periodic callback leaves them
        (job / "checkpoints" / f"step-{step:08d}.ckpt").write_bytes(b"x")
        (job / "checkpoints" / f"step-{step:08d}.ckpt.manifest.json").write_text(
            json.dumps({"step": step, "files": {"": 1}}))
    assert _interrupted(job) == (f"[scalelab] interrupted (Ctrl-C) in {job}: its newest checkpoint is "
                                 f"step-00000040.ckpt: the same command with hydra.run.dir={job} goes on from it")
    assert f"hydra.sweep.dir={tmp_path / 'runs'} (its completed jobs are kept" in _interrupted(job, tmp_path / "runs")

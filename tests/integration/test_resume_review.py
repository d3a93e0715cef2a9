"""A real Lightning checkpoint damaged at its full size (one byte of a tensor flipped) is set aside by
the launcher (renamed NAME.damaged) and the one before it resumed (it resumed silently before, or crashed in torch.load), and the `.tmp`
save a killed run left is removed when the rerun starts (tests/unit/test_resume_review.py: the logic)."""
from __future__ import annotations

import json
import os
import shutil
import struct
import subprocess
import zipfile

import pytest

from ..conftest import FAST, train

pytestmark = pytest.mark.integration


def test_a_damaged_newest_checkpoint_is_passed_over_and_stale_tmp_removed(tmp_path):
    job = tmp_path / "job"
    args = [*FAST, "strategy=single", "trainer.devices=1", "logger=none", "checkpoint.every_n_steps=5",
            "checkpoint.keep_last=2", f"hydra.run.dir={job}"]
    train([*args, "trainer.max_steps=10"], tmp_path)
    ckpts = job / "checkpoints"
    assert sorted(p.name for p in ckpts.glob("step-*.ckpt")) == ["step-00000005.ckpt", "step-00000010.ckpt"]
    newest = ckpts / "step-00000010.ckpt"
    data, size = bytearray(newest.read_bytes()), newest.stat().st_size
    info = max(zipfile.ZipFile(newest).infolist(), key=lambda i: i.compress_size)   # the largest tensor
    name_len, extra_len = struct.unpack("<HH", data[info.header_offset + 26:info.header_offset + 30])
    data[info.header_offset + 30 + name_len + extra_len + info.compress_size // 2] ^= 0xFF
    newest.write_bytes(bytes(data))
    assert newest.stat().st_size == size
    (ckpts / "step-00000015.ckpt.tmp").write_bytes(b"a save killed mid-write")
    # where it cannot be renamed (a read-only folder; root is stopped only by an immutable one): one
    # line naming it and what to fix, before any rank starts, and the job's record says so (a traceback before)
    if os.geteuid() == 0:
        ranks_log = (job / "ranks.log").read_bytes()
        subprocess.run(["chattr", "+i", str(ckpts)], check=True)
        try:
            proc = train([*args, "trainer.max_steps=15"], tmp_path, check=False)
        finally:
            subprocess.run(["chattr", "-i", str(ckpts)], check=True)
        out = proc.stdout + proc.stderr
        line = (f"checkpoint {newest} is damaged (its member {info.filename} fails its CRC check), and it cannot be "
                f"set aside as step-00000010.ckpt.damaged (Operation not permitted): {ckpts} must be writable (the "
                "job's saves need it too)")
        assert proc.returncode == 1 and "Traceback" not in out and line in out, out[-3000:]
        rec = json.loads((job / "run.json").read_text())
        assert (rec["status"], rec["error"], rec["steps"]) == ("failed", line, 0), rec
        assert (job / "ranks.log").read_bytes() == ranks_log   # no rank started
    proc = train([*args, "trainer.max_steps=15"], tmp_path)                            # the same job, rerun
    out = proc.stdout + proc.stderr
    assert (f"[scalelab] checkpoint {newest} is damaged (its member {info.filename} fails its CRC check): set aside "
            "as step-00000010.ckpt.damaged, not used") in out, out[-3000:]
    assert (ckpts / "step-00000010.ckpt.damaged").stat().st_size == size
    assert "resuming from" in out and "step-00000005.ckpt (step 5)" in out
    rec = json.loads((job / "run.json").read_text())
    assert rec["status"] == "completed" and rec["resumed_at_step"] == 5
    assert (rec["optimizer_settings"]["momentum"], rec["optimizer_settings"]["weight_decay"]) == (0.9, 0.0)
    assert "optimizer settings" not in out   # the same job resumed: its own settings, nothing to say
    assert not (ckpts / "step-00000015.ckpt.tmp").exists()
    assert sorted(p.name for p in ckpts.glob("step-*.ckpt")) == ["step-00000010.ckpt", "step-00000015.ckpt"]

    # a copy away from its job folder, renamed (no manifest, no step in its name): checked before any
    # rank by the config and step it carries (another model's copy got as far as every rank's load)
    copy = tmp_path / "colleague.ckpt"
    shutil.copy(ckpts / "step-00000015.ckpt", copy)
    start = [*FAST, "strategy=single", "trainer.devices=1", "logger=none", f"checkpoint.resume_from={copy}"]
    other = train([*start, "model.arch.n_layers=3", "trainer.max_steps=20", f"hydra.run.dir={tmp_path / 'b'}"],
                  tmp_path, check=False)
    assert other.returncode == 2 and "Traceback" not in other.stderr, other.stderr[-3000:]
    assert "was saved by another kind of run (model.arch.n_layers: 2 vs 3)" in other.stderr, other.stderr[-3000:]
    late = train([*start, "trainer.max_steps=15", f"hydra.run.dir={tmp_path / 'c'}"], tmp_path, check=False)
    assert late.returncode == 2 and "is at step 15: trainer.max_steps=15 must be larger" in late.stderr, late.stderr
    # resumed with other optimizer settings: this run's from the resumed step on (torch's load_state_dict
    # restored the checkpoint's param groups whole, and they trained on, silently)
    tuned = train([*start, "optim.optimizer.momentum=0.5", "optim.optimizer.weight_decay=0.01", "trainer.max_steps=17",
                   "lr_scaling.decay=cosine", f"hydra.run.dir={tmp_path / 'd'}"], tmp_path)
    assert ("resumed with this run's optimizer settings (momentum 0.9 -> 0.5; weight_decay 0.0 -> 0.01): the "
            "checkpoint's came back with its state") in tuned.stdout + tuned.stderr
    # and with another schedule (said on the console now: Lightning's rank_zero_info line reached no handler);
    # the constant LR of the runs above, trained longer, said so too though every step's LR was the same
    assert ("[scalelab] resumed at step 15 with another LR schedule (max_steps 15 -> 17; decay constant -> cosine): "
            "from here on it is this run's own") in tuned.stdout + tuned.stderr
    assert "another LR schedule" not in out
    # another run's checkpoint is named on the console as a job's own is (no manifest: its entries' step)
    assert f"[scalelab] resuming from {copy} (step 15; checkpoint.resume_from)" in tuned.stdout, tuned.stdout[-3000:]
    rec = json.loads((tmp_path / "d" / "run.json").read_text())
    assert rec["resumed_at_step"] == 15 and rec["steps"] == 17
    assert (rec["optimizer_settings"]["momentum"], rec["optimizer_settings"]["weight_decay"]) == (0.5, 0.01)

    # its checkpoints/ copied into a new folder (no config_resolved.yaml there), run by another kind
    # of run under checkpoint.resume=auto: refused before any rank, as resume_from is (every rank
    # crashed loading it: a size mismatch, an optimizer state KeyError)
    fresh = tmp_path / "e"
    shutil.copytree(ckpts, fresh / "checkpoints")
    other = train([*FAST, "strategy=single", "trainer.devices=1", "logger=none", "model.arch.n_layers=3",
                   "trainer.max_steps=20", f"hydra.run.dir={fresh}"], tmp_path, check=False)
    assert other.returncode == 2 and "Traceback" not in other.stderr, other.stderr[-3000:]
    assert (f"error: {fresh} holds a checkpoint of another kind of run (step-00000015.ckpt: model.arch.n_layers: "
            "2 vs 3), which checkpoint.resume=auto would resume: give this run a new folder") in other.stderr
    assert not (fresh / "ranks.log").exists()
    same = train([*start[:-1], "trainer.max_steps=17", f"hydra.run.dir={fresh}"], tmp_path)   # its own kind: resumes
    assert "step-00000015.ckpt (step 15)" in same.stdout + same.stderr


def test_a_run_continued_from_its_own_last_ckpt_keeps_its_whole_curve(tmp_path):
    """The longer-run refusal says checkpoint.resume_from=JOB/checkpoints/last.ckpt; the continued
    run's record began after the resumed step (loss.first 3.55 where the run's first was 5.54): last.ckpt
    kept no curve beside it, and resume_from's curve was never read."""
    job = tmp_path / "job"
    args = [*FAST, "strategy=single", "trainer.devices=1", "logger=none", "checkpoint.save=true",
            f"hydra.run.dir={job}"]
    train([*args, "trainer.max_steps=4"], tmp_path)
    first = json.loads((job / "run.json").read_text())
    assert (job / "checkpoints" / "last.ckpt.curve-rank0.json").is_file()
    proc = train([*args, "trainer.max_steps=6", f"checkpoint.resume_from={job / 'checkpoints' / 'last.ckpt'}"],
                 tmp_path)
    rec = json.loads((job / "run.json").read_text())
    assert (rec["resumed_at_step"], rec["steps"]) == (4, 6)
    # the 4-step record it replaced is kept beside (deleted before: a continuation that failed left none)
    assert json.loads((job / "run.completed-4.json").read_text()) == first
    assert f"the completed record of 4 steps this run replaces is kept as {job / 'run.completed-4.json'}" in \
        proc.stdout + proc.stderr
    assert [s for s, _ in rec["loss"]["curve"]] == list(range(1, 7))
    assert rec["loss"]["curve"][:4] == first["loss"]["curve"] and rec["loss"]["first"] == first["loss"]["first"]


def test_the_short_run_hint_after_a_resume_counts_from_where_a_longer_run_resumes(tmp_path):
    """A 10-step job (a checkpoint every 5) cut after its last save resumes at 5; the hint said
    'max_steps >= 12' (5 + FAST's 2 warm-up + 5 measured), and 12 then resumed at 10 and said
    '>= 17'. A longer run goes on from the newest checkpoint, step 10: 10 + 2 + 5 = 17."""
    job = tmp_path / "job"
    args = [*FAST, "strategy=single", "trainer.devices=1", "logger=none", "checkpoint.every_n_steps=5",
            "trainer.max_steps=10", f"hydra.run.dir={job}"]
    train(args, tmp_path)
    (job / "run.json").unlink()                                 # cut between its last save and its record
    proc = train(args, tmp_path)
    assert "resuming from" in proc.stdout and "(step 5" in proc.stdout, proc.stdout[-2000:]
    assert "use trainer.max_steps >= 17 (a longer run resumes from step 10)" in proc.stdout, proc.stdout[-2000:]


def test_the_short_run_hint_of_a_run_that_checkpoints_counts_from_its_last_save(tmp_path):
    """6 steps saving every 5 (4 measured after FAST's 2 warm-up): the hint said 2 + 5 = 7, and a
    longer run resumes from step 5, short again; 5 + 2 + 5 = 12."""
    proc = train([*FAST, "strategy=single", "trainer.devices=1", "logger=none", "checkpoint.every_n_steps=5",
                  "trainer.max_steps=6", f"hydra.run.dir={tmp_path / 'job'}"], tmp_path)
    assert "use trainer.max_steps >= 12 (a longer run resumes from step 5)" in proc.stdout, proc.stdout[-2000:]

"""Ctrl-C of scalelab-train: one line naming the job and how to go on (it printed a 40-line
KeyboardInterrupt traceback through Hydra and the fork server's watch loop)."""
import json

import pytest

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
    assert _interrupted(job) == (f"[scalelab] interrupted (Ctrl-C) in {job}: the same command with "
                                 f"hydra.run.dir={job} goes on from its checkpoint step-00000040.ckpt")
    assert f"hydra.sweep.dir={tmp_path / 'runs'} (its completed jobs are kept" in _interrupted(job, tmp_path / "runs")


def test_a_checkpoint_at_the_last_step_is_not_where_it_goes_on(tmp_path, monkeypatch):
    """Cut between the last step's save and the record: the rerun redoes the interval before it
    (checkpointing.resume_point), and the line named the last step's checkpoint."""
    from scalelab import train

    job = tmp_path / "r1"
    (job / "checkpoints").mkdir(parents=True)
    for step in (20, 40):
        (job / "checkpoints" / f"step-{step:08d}.ckpt").write_bytes(b"x")
        (job / "checkpoints" / f"step-{step:08d}.ckpt.manifest.json").write_text(
            json.dumps({"step": step, "files": {"": 1}}))
    monkeypatch.setitem(train._MARKS, "max_steps", 40)
    assert _interrupted(job).endswith("goes on from its checkpoint step-00000020.ckpt")
    monkeypatch.setitem(train._MARKS, "max_steps", 60)
    assert _interrupted(job).endswith("goes on from its checkpoint step-00000040.ckpt")


def test_before_the_first_checkpoint_it_says_so_and_how_to_keep_the_sweep(tmp_path, monkeypatch):
    """A sweep job Ctrl-C'd at step 1 with checkpoint.every_n_steps=50 was told to set
    checkpoint.every_n_steps, and not that a rerun into the same sweep folder keeps its completed
    jobs (the default folder is a new timestamp each time)."""
    from scalelab import train

    job = tmp_path / "runs" / "1"
    job.mkdir(parents=True)
    monkeypatch.setitem(train._MARKS, "every_n_steps", 50)
    assert _interrupted(job, tmp_path / "runs") == (
        f"[scalelab] interrupted (Ctrl-C) in {job}: it saved no checkpoint yet (checkpoint.every_n_steps=50); "
        f"the same command with hydra.sweep.dir={tmp_path / 'runs'} keeps the jobs that completed")
    monkeypatch.setitem(train._MARKS, "every_n_steps", None)
    assert _interrupted(job) == (f"[scalelab] interrupted (Ctrl-C) in {job}: it saved no checkpoint "
                                 "(checkpoint.every_n_steps=N saves one every N steps)")


def test_sigterm_is_raised_as_an_interrupt_and_named():
    from scalelab import train

    with pytest.raises(KeyboardInterrupt):            # main's Ctrl-C path ends the ranks and says how to go on
        train._terminated(15, None)
    assert train._interrupted(None, signame="SIGTERM") == "[scalelab] interrupted (SIGTERM) before any job started"


def test_after_a_job_ended_no_job_is_named_as_stopped(tmp_path, monkeypatch):
    """A Ctrl-C between a sweep's jobs (or in its summary) named the last finished job as the one
    it stopped, and told how to resume it (found by review); its record, written in this attempt,
    says it ended. An older completed record (a rerun with a larger trainer.max_steps goes on from
    it) does not."""
    import os
    import time

    from scalelab import train

    job = tmp_path / "sw" / "1"
    job.mkdir(parents=True)
    (job / "run.json").write_text(json.dumps({"status": "completed"}))
    monkeypatch.setitem(train._MARKS, "job_start", time.time() + 60)       # written before this attempt
    assert _interrupted(job, tmp_path / "sw").startswith(f"[scalelab] interrupted (Ctrl-C) in {job}: ")
    monkeypatch.setitem(train._MARKS, "job_start", os.stat(job / "run.json").st_mtime - 1)
    assert _interrupted(job, tmp_path / "sw") == (
        f"[scalelab] interrupted (Ctrl-C) between jobs, after {job} ended: no job was running; the same command "
        f"with hydra.sweep.dir={tmp_path / 'sw'} keeps the jobs that completed, runs the others and writes the "
        "sweep's summary")
    # Hydra's files of this attempt, in the same folder, are the reference where present (the
    # launcher's clock may differ from a shared file server's): a record older than them is not this attempt's
    (job / ".hydra").mkdir()
    (job / ".hydra" / "config.yaml").write_text("{}")
    os.utime(job / ".hydra" / "config.yaml", (time.time() + 60, time.time() + 60))
    assert _interrupted(job, tmp_path / "sw").startswith(f"[scalelab] interrupted (Ctrl-C) in {job}: ")
    monkeypatch.setitem(train._MARKS, "finished_dir", job)                  # run_job returned
    assert _interrupted(None, None, "SIGTERM") == (
        f"[scalelab] interrupted (SIGTERM) after the run ended: its record is {job / 'run.json'}")


def test_a_ctrl_c_while_every_job_is_validated_is_one_line(monkeypatch, capsys):
    """The first seconds of a command (imports, composing every job, data): a Ctrl-C printed two
    interleaved KeyboardInterrupt tracebacks (the command's and the fork server's), and a SIGTERM
    killed it without a word (its handler came after preflight)."""
    import signal
    import sys

    from scalelab import train

    def interrupt(on_slurm):
        raise KeyboardInterrupt

    def exit_(code):
        raise SystemExit(code)

    monkeypatch.setattr(train, "_preflight", interrupt)
    monkeypatch.setattr(train, "_fast_exit", exit_)
    monkeypatch.setattr(train.spawn, "start_server", lambda *a, **k: None)
    monkeypatch.setattr(train.spawn, "stop_server", lambda *a, **k: None)
    monkeypatch.setattr(sys, "argv", ["scalelab-train", "-m", "strategy=single,ddp"])
    monkeypatch.delenv("SLURM_JOB_ID", raising=False)
    handler = signal.getsignal(signal.SIGTERM)
    try:
        with pytest.raises(SystemExit) as e:
            train.main()
        assert signal.getsignal(signal.SIGTERM) is train._terminated     # installed before preflight
    finally:
        signal.signal(signal.SIGTERM, handler)
    assert e.value.code == 130
    assert capsys.readouterr().err.strip() == "[scalelab] interrupted (Ctrl-C) before any job started"


def test_under_make_the_line_gives_the_command_to_run(tmp_path, monkeypatch):
    """`make run` Ctrl-C'd: 'the same command with hydra.sweep.dir=...' is make's, which takes no
    such argument; the line gives the scalelab-train command itself."""
    import sys
    from pathlib import Path

    job = tmp_path / "sweeps" / "s" / "1"
    job.mkdir(parents=True)
    monkeypatch.setenv("MAKELEVEL", "1")
    monkeypatch.setenv("PATH", "/usr/bin:/bin")
    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr(sys, "argv", [str(Path(sys.executable).parent / "scalelab-train"), "-m",
                                      "experiment=default", "hydra.sweep.dir=old"])
    line = _interrupted(job, tmp_path / "sweeps" / "s")
    exe = Path(sys.executable).parent / "scalelab-train"
    assert line.endswith(f"the same command with hydra.sweep.dir={tmp_path / 'sweeps' / 's'} keeps the jobs that "
                         f"completed: {exe} -m experiment=default hydra.sweep.dir={tmp_path / 'sweeps' / 's'}"), line
    monkeypatch.delenv("MAKELEVEL")
    assert _interrupted(job, tmp_path / "sweeps" / "s").endswith("keeps the jobs that completed")

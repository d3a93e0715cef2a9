"""Review findings on the SLURM path, without a cluster (tests/slurm has the real one): a USR1
during the job script's --setup is noted and handed to scalelab.train (it ended the job); a failing
squeue or a sacct that gives no answer is "ask again", not "gone" (running jobs got failed records,
or a TimeoutExpired traceback); a kept earlier job's completed record is not failed by a rerun's
cancelled job; a --time above the partition's limit is refused (the job pended for good)."""
import json
import os
import subprocess
import sys

import pytest

from scalelab import slurm, slurm_jobs, slurm_request


def test_a_usr1_during_setup_is_noted_and_ignored_until_the_job_s_handler(tmp_path):
    script = slurm.render(1, 1, ["model=gpt_nano"], False, "00:10:00", None, 1, "scalelab", str(tmp_path),
                          setup=["kill -USR1 $$", "sleep 0.2"])
    head, _, _ = script.partition("\nexec ")
    probe = (f"{sys.executable} -c 'import os, signal; print(os.environ.get(\"SCALELAB_EARLY_USR1\"), "
             "signal.getsignal(signal.SIGUSR1) == signal.SIG_IGN)'")
    env = {**os.environ, "SLURM_JOB_ID": "7"}
    proc = subprocess.run(["bash", "-c", head + "\nexec " + probe], capture_output=True, text=True, timeout=60, env=env)
    # before: bash's default action for USR1 ended the script there (exit 138, nothing ran)
    assert proc.returncode == 0 and proc.stdout.split() == ["1", "True"], (proc.returncode, proc.stdout, proc.stderr)
    quiet = subprocess.run(["bash", "-c", head.replace("kill -USR1 $$", "true") + "\nexec " + probe],
                           capture_output=True, text=True, timeout=60, env=env)
    assert quiet.stdout.split() == ["True"], quiet.stderr          # no USR1: the variable is empty


def _fake(tmp_path, name: str, body: str) -> None:
    (tmp_path / name).write_text(f"#!/bin/bash\n{body}\n")
    (tmp_path / name).chmod(0o755)


def test_a_failing_squeue_or_a_silent_sacct_is_asked_again(tmp_path, monkeypatch, capsys):
    """squeue fails twice, then says the job is gone; sacct times out once, then says RUNNING
    once, then COMPLETED. wait() keeps polling through both and returns the final state."""
    count = tmp_path / "n"
    count.write_text("0")
    _fake(tmp_path, "squeue", f'n=$(cat {count}); echo $((n+1)) > {count}; '
                              'if [ "$n" -lt 2 ]; then echo "slurm_load_jobs error: Socket timed out" >&2; exit 1; fi')
    calls = {"sacct": 0}

    def fake_run(cmd, **kw):
        if cmd[0] == "sacct":
            calls["sacct"] += 1
            if calls["sacct"] == 1:
                raise subprocess.TimeoutExpired(cmd, 60)
            state = "RUNNING" if calls["sacct"] == 2 else "COMPLETED"
            return subprocess.CompletedProcess(cmd, 0, f"77|{state}|0:0|None|n1\n", "")
        return real(cmd, **kw)

    real = subprocess.run
    monkeypatch.setenv("PATH", f"{tmp_path}:{os.environ['PATH']}")
    monkeypatch.setattr(slurm_jobs.subprocess, "run", fake_run)
    slurm_jobs._NOTED.clear()
    states = slurm_jobs.wait(["77"], poll_s=0.01, grace_s=0.0)
    assert states["77"]["state"] == "COMPLETED" and calls["sacct"] >= 3
    err = capsys.readouterr().err
    assert "sacct gave no answer (TimeoutExpired): asking again" in err
    assert "squeue failed (slurm_load_jobs error: Socket timed out): asking again" in err


def test_a_job_squeue_no_longer_knows_is_gone(tmp_path, monkeypatch):
    _fake(tmp_path, "squeue", 'echo "slurm_load_jobs error: Invalid job id specified" >&2; exit 1')
    monkeypatch.setenv("PATH", f"{tmp_path}:{os.environ['PATH']}")
    assert slurm_jobs._squeue(["5"]) == []


def _completed(job_dir, job_id):
    job_dir.mkdir(parents=True, exist_ok=True)
    rec = {"status": "completed", "strategy": "ddp", "world_size": 1, "global_batch_size": 16,
           "loss": {"final": 4.6322}, "slurm": {"job_id": job_id, "state": "COMPLETED"}}
    (job_dir / "run.json").write_text(json.dumps(rec))
    return rec


def test_a_rerun_s_cancelled_job_leaves_the_kept_record_alone(tmp_path):
    rec = _completed(tmp_path / "0", "318")
    out = slurm_jobs.finalize(tmp_path / "0", {"state": "CANCELLED", "reason": "CANCELLED by 0"}, "342")
    assert out == rec and json.loads((tmp_path / "0" / "run.json").read_text()) == rec
    # its own job's end still lands on its own record (a requeued attempt keeps its id)
    _completed(tmp_path / "1", "400")
    own = slurm_jobs.finalize(tmp_path / "1", {"state": "COMPLETED", "reason": None, "node_list": "n1"}, "400")
    assert own["slurm"] == {"job_id": "400", "state": "COMPLETED", "exit_code": None, "reason": None,
                            "node_list": "n1"}
    # an earlier failure is not this job's: this job's own line, with its own id and array task
    (tmp_path / "2").mkdir()
    (tmp_path / "2" / "run.json").write_text(json.dumps({"status": "failed", "error": "old", "slurm": {"job_id": "9"}}))
    new = slurm_jobs.finalize(tmp_path / "2", {"state": "CANCELLED", "reason": "x"}, "500_1",
                              {"strategy": "fsdp", "world_size": 2, "global_batch_size": 32, "name": "a/1"})
    assert (new["slurm"]["job_id"], new["slurm"]["array_task_id"], new["strategy"]) == ("500_1", 1, "fsdp")
    assert new["error"].startswith("SLURM job 500_1 ended CANCELLED") and "old" not in new["error"]


def test_submitted_meta_names_the_strategy_and_batch():
    meta = slurm._submitted(["strategy=fsdp", "data.global_batch_size=48", "trainer.devices=2"], 1, 2, "s/0", "/x/s")
    assert meta == {"world_size": 2, "name": "s/0", "sweep_dir": "/x/s", "strategy": "fsdp", "global_batch_size": 48}


@pytest.mark.parametrize("limit,partition,asked,refused", [
    ("10:00", None, "20", True),               # 20 min over the default partition's 10
    ("10:00", None, "00:09:00", False),
    ("UNLIMITED", None, "7-00:00:00", False),
    ("1-00:00:00", "gpu", "1-00:00:01", True),  # a partition named
    ("10:00", "other", "20", False),            # another partition than the one with the limit
])
def test_a_time_above_the_partition_s_limit_is_refused(tmp_path, monkeypatch, limit, partition, asked, refused):
    _fake(tmp_path, "sinfo", f'echo "debug*|{limit}"; echo "gpu|{limit}"')
    monkeypatch.setenv("PATH", f"{tmp_path}:{os.environ['PATH']}")
    script = f"#SBATCH --time={asked}\n" + (f"#SBATCH --partition={partition}\n" if partition else "")
    why = slurm_request._over_time_limit(script)
    assert bool(why) == refused, why
    if refused:
        name = partition or "debug"
        assert why == (f"--time {asked} is above partition {name}'s time limit {limit}: give a --time within it or "
                       "another --partition")



def test_a_key_given_to_wandb_login_in_setup_is_refused_and_not_shown(capsys, tmp_path):
    from scalelab.cli import build_parser

    key = "0123456789abcdef0123456789abcdef01234567"
    for line in (f"wandb login {key}", f"wandb login --relogin {key}"):
        a = build_parser().parse_args(["slurm", "render", "model=gpt_nano", "--cpu", "--log-dir", str(tmp_path),
                                       "--setup", line])
        assert slurm.run(a) == 2
        err = capsys.readouterr().err
        assert err.startswith("error: --setup 'wandb login ") and "would write a secret" in err and key not in err
    a = build_parser().parse_args(["slurm", "render", "model=gpt_nano", "--cpu", "--log-dir", str(tmp_path),
                                   "--setup", "wandb login $WANDB_API_KEY"])
    assert slurm.run(a) == 0 and "wandb login $WANDB_API_KEY" in capsys.readouterr().out


def test_a_sweep_through_slurm_refuses_another_launcher(tmp_path):
    """It was dropped silently (the job ran launcher=srun), where `slurm submit` refused it."""
    from ..conftest import TRAIN, env

    proc = subprocess.run([*TRAIN, "-m", "hydra/launcher=slurm", "launcher=local", "model=gpt_nano",
                           f"hydra.sweep.dir={tmp_path / 'sw'}"], cwd=tmp_path, env=env(), capture_output=True,
                          text=True, timeout=120)
    assert proc.returncode == 2 and proc.stderr == ("error: launcher=local: a hydra/launcher=slurm sweep runs every job "
                                                    "with launcher=srun (its ranks are the SLURM job's tasks): drop it\n")
    assert not (tmp_path / "sw").exists()


def _clock(monkeypatch, step: float = 10.0):
    """wait()'s clock advances STEP s per poll (no real sleeping)."""
    t = [0.0]
    monkeypatch.setattr(slurm_jobs.time, "monotonic", lambda: t[0])
    monkeypatch.setattr(slurm_jobs.time, "sleep", lambda s: t.__setitem__(0, t[0] + step))
    return t


def test_a_squeue_that_keeps_failing_ends_when_accounting_says_done(monkeypatch):
    monkeypatch.setattr(slurm_jobs, "_squeue", lambda ids: None)
    monkeypatch.setattr(slurm_jobs, "sacct", lambda ids: {"9": {"state": "COMPLETED", "reason": None}})
    t = _clock(monkeypatch)
    assert slurm_jobs.wait(["9"], grace_s=60)["9"]["state"] == "COMPLETED" and 60 < t[0] <= 80   # looped forever


def test_a_silent_sacct_uses_no_grace_and_silence_has_an_end(monkeypatch):
    answers = iter([None] * 20 + [{"9": {"state": "COMPLETED", "reason": None}}])
    monkeypatch.setattr(slurm_jobs, "_squeue", lambda ids: [])
    monkeypatch.setattr(slurm_jobs, "sacct", lambda ids: next(answers))
    _clock(monkeypatch)
    # 200 s of timeouts after the job left the queue: still COMPLETED (UNKNOWN after 60 s before)
    assert slurm_jobs.wait(["9"], grace_s=60)["9"]["state"] == "COMPLETED"
    monkeypatch.setattr(slurm_jobs, "sacct", lambda ids: None)
    t = _clock(monkeypatch)
    st = slurm_jobs.wait(["9"], grace_s=60, silent_s=300)["9"]
    assert (st["state"], st["reason"]) == ("UNKNOWN", "squeue / sacct gave no answer for 300 s") and t[0] <= 320


def test_a_local_run_s_record_is_not_a_slurm_job_s(tmp_path):
    (tmp_path / "run.json").write_text(json.dumps({"status": "completed", "slurm": None, "loss": {"final": 3.0}}))
    out = slurm_jobs.finalize(tmp_path, {"state": "FAILED", "reason": "NonZeroExitCode (exit 1)"}, "412")
    assert out == {"status": "completed", "slurm": None, "loss": {"final": 3.0}}   # was failed, with job 412 on it


def test_the_time_check_sees_no_limit_asked_and_sbatch_partition(tmp_path, monkeypatch):
    _fake(tmp_path, "sinfo", 'echo "short*|30:00"; echo "long|2-00:00:00"')
    monkeypatch.setenv("PATH", f"{tmp_path}:{os.environ['PATH']}")
    for asked in ("UNLIMITED", "0"):     # no limit asked on a partition with one: PartitionTimeLimit
        assert slurm_request._over_time_limit(f"#SBATCH --time={asked}\n").startswith(f"--time {asked} is above")
    monkeypatch.setenv("SBATCH_PARTITION", "long")      # sbatch's own default partition: not short's 30 min
    assert slurm_request._over_time_limit("#SBATCH --time=01:00:00\n") is None
    assert slurm_request._over_time_limit("#SBATCH --time=3-00:00:00\n").startswith("--time 3-00:00:00 is above "
                                                                                     "partition long's")


def test_login_keys_quoted_or_prefixed_and_quoted_run_dirs():
    from scalelab.results.record import literal_secret, redact_text

    key = "0123456789abcdef0123456789abcdef01234567"
    for line in (f'wandb login "{key}"', f"wandb login --host https://w.corp local-{key}"):
        assert literal_secret(line) and key not in redact_text(line)
    for line in ("wandb login --host https://w.corp", f"wandb login $KEY && git checkout {key}"):
        assert not literal_secret(line)
    assert [slurm._unquoted(v) for v in ("'runB'", '"a b"', "runC", "'x")] == ["runB", "a b", "runC", "'x"]


def test_a_secret_given_to_a_flag_or_known_by_its_prefix_is_a_literal_secret():
    # `huggingface-cli login --token hf_...` passed the KEY=VALUE checks and went into the job script
    from scalelab.results.record import literal_secret, redact_text

    hf, gh = "hf_" + "a1B2c3D4e5" * 3, "ghp_" + "Z9y8X7w6V5" * 3
    for line, secret in ((f"huggingface-cli login --token {hf}", hf), ("mytool --api-key abc123xyz", "abc123xyz"),
                         ('cmd --password "two words"', '"two words"'), (f"git clone https://{gh}@github.com/o/r", gh),
                         (f"export HF_HOME=/scratch X={hf}", hf)):
        assert literal_secret(line) and secret not in redact_text(line), line
        with pytest.raises(ValueError, match="would write a secret into the SLURM job script"):
            slurm.refuse_secret_lines([line])
    for line in ("huggingface-cli login --token $HF_TOKEN", 'tool --token "${TOK}"', "python x.py --token-file ~/.t",
                 "run --auth-token -v", "echo --tokens 5", "module load cuda/12.4"):
        assert not literal_secret(line) and redact_text(line) == line, line


@pytest.mark.parametrize("args, line", [
    (["hydra.launcher.gpus_per_node=1", "trainer.devices=1,2"],
     "error: hydra.launcher.gpus_per_node=1 is below job #1's trainer.devices=2 (a rank per GPU): give "
     "gpus_per_node=auto (= trainer.devices) or more, or trainer.accelerator=cpu for a CPU job\n"),
    (["hydra.launcher.job_name=team/exp1"],
     "error: hydra.launcher.job_name='team/exp1' has a '/': it names the job's log file, not a folder (give the "
     "folder with --log-dir)\n")])
def test_a_slurm_sweep_the_jobs_could_not_run_is_refused_before_submitting(tmp_path, args, line):
    # too few GPUs failed in each job's worker after its queue wait; a '/' in the name lost the job's log
    from ..conftest import TRAIN, env

    proc = subprocess.run([*TRAIN, "-m", "hydra/launcher=slurm", "model=gpt_nano", *args,
                           f"hydra.sweep.dir={tmp_path / 'sw'}"], cwd=tmp_path, env=env(), capture_output=True,
                          text=True, timeout=120)
    assert proc.returncode == 2 and proc.stderr == line, proc.stderr
    assert not (tmp_path / "sw").exists()


def test_a_node_shape_the_partition_lacks_is_refused_whatever_is_drained_elsewhere(tmp_path, monkeypatch):
    """`sbatch --test-only` answers "Requested node configuration is not available" both for a
    request no node has (8 GPUs on 4-GPU nodes) and while the nodes that have it are down. A drained
    node in another partition (a real cluster nearly always has one) made every such request a
    warning and a submission; only the job's own partition counts."""
    from scalelab import slurm_request

    _fake(tmp_path, "sbatch", 'echo "sbatch: error: Requested node configuration is not available" >&2; exit 1')
    # `-t down,...` lists 3 drained nodes of `cpu` and none of `gpu`; the default partition is gpu
    _fake(tmp_path, "sinfo", 'case "$*" in *"-o %P"*) echo "gpu*"; echo cpu ;; *"-p gpu"*) echo 0 ;; '
                             '*"-p cpu"*) echo 3 ;; *"-t "*) echo 3 ;; *) echo "gpu*|1|64|gpu:4|1-00:00:00" ;; esac')
    monkeypatch.setenv("PATH", f"{tmp_path}:{os.environ['PATH']}")
    monkeypatch.delenv("SBATCH_PARTITION", raising=False)
    for script in ("#SBATCH --partition=gpu\n", ""):                  # named, and the default
        (tmp_path / "job.sbatch").write_text(f"#!/bin/bash\n{script}#SBATCH --gpus-per-node=8\n")
        with pytest.raises(ValueError, match="^SLURM would never start this job \\(Requested node configuration"):
            slurm_request.test_only(tmp_path / "job.sbatch", "1 node(s) x 8 GPU(s)")
    (tmp_path / "job.sbatch").write_text("#!/bin/bash\n#SBATCH --partition=cpu\n")   # its own nodes are down
    slurm_request.test_only(tmp_path / "job.sbatch", "1 node(s)")     # a warning: a real job would wait for them

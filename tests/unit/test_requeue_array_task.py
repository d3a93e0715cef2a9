"""A warning signal (USR1) to one array task requeues that task only: `scontrol requeue
$SLURM_JOB_ID` of the task whose raw id is the array's id (530 for task 530_1) requeued, and
killed mid-run, every task of the array (a walkthrough: 530_0 REQUEUED as well, with 51 steps
this attempt)."""
import signal
import subprocess
from types import SimpleNamespace

from scalelab import requeue


def test_an_array_task_requeues_itself_by_its_task_id(tmp_path, monkeypatch):
    for k, v in {"SLURM_JOB_ID": "530", "SLURM_ARRAY_JOB_ID": "530", "SLURM_ARRAY_TASK_ID": "1",
                 "SLURM_RESTART_COUNT": "0"}.items():
        monkeypatch.setenv(k, v)
    (tmp_path / requeue.PREEMPTED).write_text("312 SIGUSR1")
    calls = []
    monkeypatch.setattr(subprocess, "run", lambda argv, **kw: calls.append(argv) or SimpleNamespace(returncode=0))
    line = requeue.after_ranks(tmp_path, [signal.SIGUSR1])
    assert calls == [["scontrol", "requeue", "530_1"]] and "job 530_1 requeued" in line
    monkeypatch.delenv("SLURM_ARRAY_JOB_ID")
    monkeypatch.delenv("SLURM_ARRAY_TASK_ID")
    requeue.after_ranks(tmp_path, [signal.SIGUSR1])
    assert calls[-1] == ["scontrol", "requeue", "530"]                      # a plain job: its own id

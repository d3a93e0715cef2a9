"""Review findings on launcher=torchrun across nodes: a rank killed by a signal is named from
torchrun's own summary (the error was its box's rule of '='); node K's placeholder record in a
folder of its own is no run for compare."""
import json

from scalelab.job_outcome import error_message
from scalelab.results.record import read_records

from .test_results import _rec

# node 1's ranks.log when its rank was SIGKILLed (the OOM killer's way), as torchrun 2.13 writes it
KILLED = """E1203 07:37:53.275000 28314 torch/distributed/elastic/multiprocessing/api.py:1002] failed (exitcode: -9) local_rank: 0 (pid: 28331) of binary: python3
Traceback (most recent call last):
  File "<frozen runpy>", line 198, in _run_module_as_main
torch.distributed.elastic.multiprocessing.errors.ChildFailedError: 
======================================================
scalelab.worker FAILED
------------------------------------------------------
Failures:
  <NO_OTHER_FAILURES>
------------------------------------------------------
Root Cause (first observed failure):
[0]:
  time      : 2026-12-03_07:37:53
  host      : localhost
  rank      : 1 (local_rank: 0)
  exitcode  : -9 (pid: 28331)  (SIGKILL)
  error_file: <N/A>
  traceback : Signal 9 (SIGKILL) received by PID 28331
======================================================
"""


def test_a_rank_killed_by_a_signal_is_named(tmp_path):
    (tmp_path / "ranks.log").write_text(KILLED)
    assert error_message(tmp_path, 1) == "rank 1 failed first (killed by signal 9); torchrun's summary is in ranks.log"
    (tmp_path / "ranks.log").write_text(KILLED.replace("-9 (pid: 28331)  (SIGKILL)", "3 (pid: 28331)"))
    assert error_message(tmp_path, 1).startswith("rank 1 failed first (exit code 3)")
    # its peer on the node wrote an error file, the lost connection: the killed rank still comes first
    (tmp_path / "ranks.log").write_text(KILLED)
    (tmp_path / "error-rank0.txt").write_text("Traceback ...\nRuntimeError: [gloo] Connection closed by peer\n")
    assert error_message(tmp_path, 1) == ("rank 1 failed first (killed by signal 9); torchrun's summary is in "
                                          "ranks.log (error-rank0: RuntimeError: [gloo] Connection closed by peer)")


def test_a_node_placeholder_in_its_own_folder_is_no_run(tmp_path, capsys):
    """scalelab k8s --pvc's NAME/node0 and NAME/node1: compare NAME showed node 1's placeholder as a
    second completed row of dashes. Given as a file, it is read (the user asked for that one)."""
    (tmp_path / "node0").mkdir()
    (tmp_path / "node1").mkdir()
    (tmp_path / "node0" / "run.json").write_text(json.dumps(_rec("job1", "ddp", 2, 16, 10.0)))
    placeholder = tmp_path / "node1" / "run.json"
    placeholder.write_text(json.dumps({**_rec("job1", "ddp", 2, 16, 10.0), "node_rank": 1, "record_on_node": 0}))
    problems: list[str] = []
    recs = read_records([tmp_path], problems)
    assert [r["job"]["record_path"] for r in recs] == [str(tmp_path / "node0" / "run.json")]
    assert problems == [f"{placeholder}: node 1's part of a multi-node job, no run of its own (its record is node "
                        "0's)"]
    assert len(read_records([placeholder], [])) == 1


def test_a_node_left_waiting_says_how_many_came(tmp_path):
    """Node 0 given trainer.num_nodes=3, node 1 given 2: node 0 waits its rdzv_timeout_s and its line
    named no key; now it says how many nodes it expected and that num_nodes must agree."""
    from scalelab.job_outcome import rendezvous_error

    (tmp_path / "ranks.log").write_text("torch.distributed.DistStoreError: Timed out after 21 seconds waiting for "
                                        "clients. 2/3 clients joined.\n")
    line = rendezvous_error(tmp_path, {"endpoint": "n0:29653", "node_rank": 0, "timeout_s": 20})
    assert line.endswith("(2 of the 3 nodes this one expects (trainer.num_nodes=3 here) joined: every node must run "
                         "the same command with its own launcher.node_rank within launcher.rdzv_timeout_s=20, and "
                         "the same trainer.num_nodes)")

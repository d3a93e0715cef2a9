"""Which rank's failure caused the others' (scalelab.launch.cause_rank): a rank that raised writes
error-rank<R>.txt as its exception leaves it; its peers then fail on gloo's or NCCL's 'connection
reset/closed by peer' ~30 ms later (measured, 2-rank gloo job, rank 1 raising at step 3). Both
exit 1 at once, so exit order does not tell them apart; the job's error must name the cause."""
import os

from scalelab.launch import cause_rank
from scalelab.job_outcome import error_message as _error_message

RAISED = "Traceback (most recent call last):\n  File \"w.py\"\nRuntimeError: injected rank crash at step 3\n"
LOST = ("Traceback (most recent call last):\n  File \"w.py\"\nRuntimeError: [../gloo/transport/tcp/pair.cc:537] "
        "Read error [127.0.0.1]:6573: Connection reset by peer\n")
T = 1_800_000_000   # seconds


def _write(d, rank, text, at):
    f = d / f"error-rank{rank}.txt"
    f.write_text(text)
    os.utime(f, ns=(int(at * 1e9), int(at * 1e9)))


def test_a_rank_that_raised_beats_an_older_lost_connection(tmp_path):
    _write(tmp_path, 0, LOST, T)
    _write(tmp_path, 1, RAISED, T + 0.03)
    assert cause_rank(tmp_path, [0, 1]) == 1
    assert cause_rank(tmp_path, [0]) == 0            # only the peer failed (the other was killed)


def test_otherwise_the_oldest_error_file(tmp_path):
    _write(tmp_path, 0, RAISED, T + 0.03)
    _write(tmp_path, 1, RAISED, T)
    _write(tmp_path, 2, LOST, T - 1)
    assert cause_rank(tmp_path, [0, 1, 2]) == 1
    assert cause_rank(tmp_path, [2]) == 2


def test_an_earlier_attempt_s_file_and_a_missing_one_do_not_count(tmp_path):
    _write(tmp_path, 0, LOST, T)
    _write(tmp_path, 1, RAISED, T - 60)               # left from the attempt before a restart
    assert cause_rank(tmp_path, [0, 1, 3], since=T - 1) == 0
    assert cause_rank(tmp_path, [3]) is None


def test_torchrun_s_error_names_the_rank_that_raised(tmp_path):
    """torchrun writes no 'failed first' line: the error files decide (they were read by name)."""
    (tmp_path / "ranks.log").write_text("step 3\n")
    _write(tmp_path, 0, LOST, T + 0.03)
    _write(tmp_path, 1, RAISED, T)
    assert _error_message(tmp_path, 1) == "rank 1 failed first: RuntimeError: injected rank crash at step 3"


def test_srun_s_first_exit_that_only_lost_its_peer_names_the_one_that_raised(tmp_path):
    (tmp_path / "ranks.log").write_text("srun: error: node1: task 0: Exited with exit code 1\n")
    _write(tmp_path, 0, LOST, T + 0.03)
    _write(tmp_path, 1, RAISED, T)
    assert _error_message(tmp_path, 1) == ("rank 1 failed: RuntimeError: injected rank crash at step 3 "
                                           "(rank 0 exited first: Exited with exit code 1)")
    # a task srun saw killed (no error file: the OOM killer) stays the cause
    (tmp_path / "ranks.log").write_text("srun: error: node1: task 2: Killed\n")
    assert _error_message(tmp_path, 1) == "rank 2 failed first (Killed); its peers were ended"
    # and one whose own error is the cause stays named
    (tmp_path / "ranks.log").write_text("srun: error: node1: task 1: Exited with exit code 1\n")
    assert _error_message(tmp_path, 1) == ("rank 1 failed first (Exited with exit code 1): RuntimeError: injected "
                                           "rank crash at step 3")


def test_a_timeout_is_the_job_s_error_whatever_the_ended_ranks_wrote(tmp_path):
    """trainer.timeout_s: the launcher ends the ranks (SIGTERM); their errors are its doing (a
    rank's SIGTERMException, its peer's lost connection) and were reported instead of the timeout."""
    (tmp_path / "ranks.log").write_text("step 40\n\njob exceeded trainer.timeout_s\n")
    _write(tmp_path, 0, "Traceback (most recent call last):\nlightning.pytorch.utilities.exceptions.SIGTERMException\n", T)
    _write(tmp_path, 1, LOST, T + 0.01)
    assert _error_message(tmp_path, 124) == "timed out (trainer.timeout_s)"


def test_a_rank_the_launcher_ended_is_a_consequence_too(tmp_path):
    """3 ranks: rank 2 killed by the OOM killer (no file), rank 0 ended by the launcher's SIGTERM
    (older file), rank 1 lost its connection: none raised, so the oldest consequence; and a rank
    that raised beats a SIGTERMed one whatever the files' ages."""
    ended = "Traceback (most recent call last):\nlightning.pytorch.utilities.exceptions.SIGTERMException\n"
    _write(tmp_path, 0, ended, T)
    _write(tmp_path, 1, RAISED, T + 0.5)
    assert cause_rank(tmp_path, [0, 1, 2]) == 1
    _write(tmp_path, 1, LOST, T + 0.5)
    assert cause_rank(tmp_path, [0, 1, 2]) == 0


def test_each_rank_removes_its_own_earlier_error_file_when_it_starts(tmp_path, monkeypatch):
    """An earlier attempt's error-rank file (a restart) was read as this attempt's error."""
    from scalelab import worker

    (tmp_path / "error-rank0.txt").write_text("ValueError: attempt 1\n")
    monkeypatch.setenv("RANK", "0")
    monkeypatch.setattr(worker, "run", lambda job_dir, marks: 0)
    assert worker.rank_entry(tmp_path) == 0 and not (tmp_path / "error-rank0.txt").exists()
    (tmp_path / "error-rank0.txt").write_text("ValueError: attempt 1\n")
    monkeypatch.setattr("sys.argv", ["worker", str(tmp_path)])
    assert worker.main() == 0 and not (tmp_path / "error-rank0.txt").exists()


TIMEOUT = ("Traceback (most recent call last):\n  File \"w.py\"\nRuntimeError: [../gloo/transport/tcp/unbound_buffer.cc:81] "
           "Timed out waiting 15000ms for recv operation to complete\n")


def test_under_torchrun_a_collective_timeout_names_the_rank_that_wrote_nothing(tmp_path):
    """torchrun_local, rank 1 hung (SIGSTOP) at a step: rank 0's recv timed out and torchrun ended
    rank 1, which wrote no error. The record said "rank 0 failed first: ... Timed out" (review); as
    launcher=local says it, the hung one is named."""
    (tmp_path / "ranks.log").write_text("step 3\n")
    _write(tmp_path, 0, TIMEOUT, T)
    line = "rank 0 failed first: RuntimeError: [../gloo/transport/tcp/unbound_buffer.cc:81] Timed out waiting " \
           "15000ms for recv operation to complete"
    assert _error_message(tmp_path, 1, [0, 1]) == (line + "; rank 1 wrote no error when its collective timed out: "
                                                   "hung or slow there, look at rank 1 first")
    assert _error_message(tmp_path, 1, [0]) == line          # node 0 of 2 nodes: its one rank wrote it
    _write(tmp_path, 1, RAISED, T + 1)                        # a rank that raised is no hung one
    assert "wrote no error" not in _error_message(tmp_path, 1, [0, 1])


def test_a_node_whose_ranks_all_timed_out_points_to_another_node(tmp_path):
    from scalelab.job_outcome import failed_on_node

    (tmp_path / "ranks.log").write_text("step 3\n")
    _write(tmp_path, 0, TIMEOUT, T)
    record = {"error": _error_message(tmp_path, 1, [0])}
    failed_on_node(record, tmp_path, {"node_rank": 0, "endpoint": "127.0.0.1:29651"})
    assert record["error"].startswith("rank 0 failed on this node: RuntimeError:")
    assert record["error"].endswith("(it waited for a peer: the rank that hung or was slow may be on another node, "
                                    "whose ranks.log says why)")


def test_on_a_node_with_a_silent_peer_the_other_nodes_stay_suspects(tmp_path):
    from scalelab.job_outcome import failed_on_node

    (tmp_path / "ranks.log").write_text("step 3\n")
    _write(tmp_path, 0, TIMEOUT, T)
    record = {"error": _error_message(tmp_path, 1, [0, 1])}
    failed_on_node(record, tmp_path, {"node_rank": 0, "endpoint": "127.0.0.1:29651"})
    assert record["error"].endswith("look at rank 1 first (or on another node, whose ranks.log says why)")

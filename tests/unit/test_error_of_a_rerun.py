"""A job run again in its folder (to resume it) reports its own error: ranks.log keeps every run,
so the launcher marks where this one starts, and an earlier run's error-rank files are removed
before it (train.run_job); the job's error is read from this run's part only."""
from scalelab import spawn
from scalelab.job_outcome import ATTEMPT_MARK, RERUN_MARK, error_message as _error_message

EARLIER = "[scalelab] rank 1 failed first (killed by signal 9)\n"


def test_an_earlier_run_s_failure_is_not_this_run_s(tmp_path):
    (tmp_path / "ranks.log").write_text(f"{EARLIER}{RERUN_MARK} 1764633600\nrank 0: step 3\n")
    assert spawn.FAILED_FIRST.search(EARLIER)                    # the line the launcher writes
    assert _error_message(tmp_path, 1) == "ranks exited with code 1: rank 0: step 3"
    assert _error_message(tmp_path, 124) == "timed out (trainer.timeout_s)"
    # without the mark (one run) the same log names rank 1
    (tmp_path / "ranks.log").write_text(f"rank 0: step 3\n{EARLIER}")
    assert _error_message(tmp_path, 1) == "rank 1 failed first (killed by signal 9); its peers were ended"


def test_a_slurm_attempt_is_marked_as_before(tmp_path):
    (tmp_path / "ranks.log").write_text(f"{EARLIER}{ATTEMPT_MARK} 77 requeue 1\nrank 0: step 3\n")
    assert _error_message(tmp_path, 1) == "ranks exited with code 1: rank 0: step 3"


def test_a_killed_launcher_s_error_is_not_one_of_scalelab_s_own_notes(tmp_path):
    """torchrun killed (SIGKILL) with its ranks: no error file, no Root Cause block; the error quoted
    the log's last line, the worker's GLOO_SOCKET_IFNAME note, as the cause."""
    (tmp_path / "ranks.log").write_text(
        "step 3/20 | 812 tokens/s | loss 5.1\n"
        "[scalelab] GLOO_SOCKET_IFNAME=eth0 (the default route's interface): MASTER_ADDR=127.0.0.1 routes ...\n"
        "[rank1]: [scalelab] data: 10 documents\n")
    assert _error_message(tmp_path, -9) == "ranks exited with code -9 (killed by signal 9): step 3/20 | 812 tokens/s | loss 5.1"
    (tmp_path / "ranks.log").write_text("[scalelab] GLOO_SOCKET_IFNAME=eth0\n")
    assert _error_message(tmp_path, -9) == "ranks exited with code -9 (killed by signal 9)"
    (tmp_path / "ranks.log").write_text("[scalelab] error: something broke\n")      # its errors still are
    assert _error_message(tmp_path, 1) == "ranks exited with code 1: [scalelab] error: something broke"

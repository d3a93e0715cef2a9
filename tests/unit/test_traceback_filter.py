"""launcher=torchrun's console without tracebacks (scalelab.launch.TracebackFilter): a rendezvous or
rank failure printed 45-140 lines of torchrun's and the ranks' tracebacks and C++ frames before the
job's one-line error; ranks.log keeps them. Fed in 7-byte chunks, as a pipe may cut it."""
from scalelab.launch import TracebackFilter

TEXT = (b"step 1/6 | 100 tokens/s\rstep 2/6 | 120 tokens/s\n"
        b"[rank0]: Traceback (most recent call last):\n"
        b"[rank0]:   File \"x.py\", line 1, in <module>\n"
        b"[rank0]:     boom()\n"
        b"[rank0]: RuntimeError: boom\n"
        b"Traceback (most recent call last):\n"
        b"  File \"run.py\", line 3\n"
        b"    main()\n"
        b"torch.distributed.DistStoreError: wait timeout\n"
        b"Exception raised from recvBytes at Utils.hpp:678 (most recent call first):\n"
        b"frame #0: c10::Error::Error(...)\n"
        b"frame #1: foo\n"
        b"<omitting python frames>\n"
        b"frame #39: bar\n"
        b"\n"
        b"normal line\n"
        b"torch.distributed.elastic.multiprocessing.errors.ChildFailedError: \n"
        b"============================================================\n"
        b"scalelab.worker FAILED\n"
        b"------------------------------------------------------------\n"
        b"Failures:\n"
        b"  <NO_OTHER_FAILURES>\n"
        b"============================================================\n"
        b"last line without a newline")


def test_tracebacks_and_frames_are_left_out_their_exceptions_kept():
    f = TracebackFilter()
    out = b"".join(f.feed(TEXT[i:i + 7]) for i in range(0, len(TEXT), 7)) + f.flush()
    assert out == (b"step 1/6 | 100 tokens/s\rstep 2/6 | 120 tokens/s\n"
                   b"[rank0]: RuntimeError: boom\n"
                   b"torch.distributed.DistStoreError: wait timeout\n"
                   b"normal line\n"
                   b"last line without a newline")
    # 3 + 3 lines of the two tracebacks, 1 + 4 + 1 (blank) of the C++ dump (its "<omitting python
    # frames>" line ended the skip: frame #39 reached the console), 7 of torchrun's box
    assert f.dropped == 19


def test_a_progress_bar_update_shows_before_its_newline():
    f = TracebackFilter()
    assert f.feed(b"\rstep 3/6 | 130 tokens/s") == b"\rstep 3/6 | 130 tokens/s"
    assert f.feed(b"\rstep 4/6") == b"\rstep 4/6"


def test_an_exception_after_the_progress_bar_starts_its_own_line():
    """launcher=local: rank 1's traceback arrives while rank 0's bar holds the console's line."""
    f = TracebackFilter()
    out = f.feed(b"\rstep 1/10 | 15,303 tokens/s") + f.feed(b"Traceback (most recent call last):\n  File \"w.py\"\n")
    out += f.feed(b"RuntimeError: injected rank crash at step 3\n") + f.flush()
    assert out == b"\rstep 1/10 | 15,303 tokens/s\nRuntimeError: injected rank crash at step 3\n"
    assert f.dropped == 2


def test_a_job_end_line_starts_its_own_line_after_an_open_progress_bar(capfd):
    """A job that timed out (or lost a rank without an exception line) printed its FAILED line glued
    to the progress bar's `step 1/8 | ...` (its \\r line has no newline; found by review)."""
    from scalelab import launch

    launch.tee(b"step 1/8 | 9,894 tokens/s\rstep 2/8 | 9,901 tokens/s")
    launch.end_open_line()
    print("[scalelab] job s4/0 FAILED: timed out", flush=True)
    launch.tee(b"step 8/8 | 10,000 tokens/s\n")   # a closed line: nothing added
    launch.end_open_line()
    print("done", flush=True)
    assert capfd.readouterr().out == ("step 1/8 | 9,894 tokens/s\rstep 2/8 | 9,901 tokens/s\n"
                                      "[scalelab] job s4/0 FAILED: timed out\nstep 8/8 | 10,000 tokens/s\ndone\n")


def test_torchruns_own_log_lines_stay_in_ranks_log():
    """torchrun's glog-style lines on how it ended its children (a crash under torchrun_local
    printed `W1203 ... Sending process N closing signal SIGTERM` and `E1203 ... failed (exitcode:
    1) ...` after the ranks' errors; found by review) are counted, not shown; the ranks' own
    warnings and exception lines are."""
    from scalelab.launch import TracebackFilter

    f = TracebackFilter()
    out = f.feed(b"[rank1]: RuntimeError: injected rank crash at step 3\n"
                 b"W1203 11:39:44.618000 29647 .venv/lib/python3.11/site-packages/torch/distributed/elastic/"
                 b"multiprocessing/api.py:1028] Sending process 29651 closing signal SIGTERM\n"
                 b"E1203 11:39:44.684000 29647 .venv/lib/python3.11/site-packages/torch/distributed/elastic/"
                 b"multiprocessing/api.py:1002] failed (exitcode: 1) local_rank: 1 (pid: 29652)\n"
                 b"W1203 11:39:44.700000 29648 torch/utils/data/loader.py:12] a rank's own warning\n")
    assert out == (b"[rank1]: RuntimeError: injected rank crash at step 3\n"
                   b"W1203 11:39:44.700000 29648 torch/utils/data/loader.py:12] a rank's own warning\n")
    assert f.logs_dropped == 2 and f.dropped == 0


def test_c10d_s_retry_warnings_show_once_each():
    """A node given an endpoint that does not resolve printed c10d's warning once a second (12
    lines in 15 s; ~990 over the default launcher.rdzv_timeout_s): each message once, its cause."""
    f = TracebackFilter()
    gai = (b"[W1203 16:01:%02d.118000 2964 torch/csrc/distributed/c10d/socket.cpp:764] [c10d] The IPv6 network "
           b"addresses of (nosuchhost.invalid, 29500) cannot be retrieved (gai error: -2 - Name or service not known).\n")
    store = b"[W1203 16:01:%02d.5 2964 TCPStore.cpp:340] [c10d] TCP client failed to connect after %dms; retrying\n"
    out = b"".join(f.feed(gai % i) + f.feed(store % (i, 1000 * i)) for i in range(12))
    assert out == (gai % 0) + (store % (0, 0))
    assert f.logs_dropped == 22
    assert f.feed(b"[W1203 16:02:00.1 2964 socket.cpp:1] [c10d] another message\n").endswith(b"another message\n")

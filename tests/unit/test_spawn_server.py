"""The rank fork server imports the worker with one thread only: a fork copies the calling thread
alone, and a library thread (OpenBLAS's pool, pyarrow's jemalloc background thread) caught in
malloc leaves the child's heap corrupt."""
import os
import subprocess
import sys

from scalelab.spawn import PRELOAD, SERVER_ENV


def _threads_after_preload(env: dict) -> int:
    code = f"import os; import {', '.join(PRELOAD)}; print(len(os.listdir('/proc/self/task')))"
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    return int(out.stdout.strip())


def test_server_environment_leaves_one_thread():
    base = {k: v for k, v in os.environ.items() if k not in SERVER_ENV}
    assert _threads_after_preload({**base, **SERVER_ENV}) == 1
    if (os.cpu_count() or 1) > 1:  # without it, OpenBLAS and jemalloc start their threads
        assert _threads_after_preload(base) > 1


def test_a_dead_server_is_started_again_as_the_command_starts_it():
    """A fork server that died mid-command (an OOM kill) was started again by multiprocessing on the
    next rank's start, without SERVER_ENV and fork_guard's death signal (found by review): the next
    job's start_server starts it with them."""
    code = (
        "import os, signal, time\n"
        "from multiprocessing import forkserver\n"
        "from scalelab import spawn\n"
        "spawn.start_server()\n"
        "first = forkserver._forkserver._forkserver_pid\n"
        "os.kill(first, signal.SIGKILL); time.sleep(0.5)\n"
        "spawn.start_server({'SCALELAB_TEST': '1'})\n"
        "second = forkserver._forkserver._forkserver_pid\n"
        # ensure_running returns before the new server has exec'd: until then /proc/PID/environ is
        # the forked launcher's original block (a race under load; CI read it once)
        # (the server's command line: `... from multiprocessing.forkserver import main ...`, built here so
        # that this script's own command line, the forked child's before its exec, does not hold it)
        "t, mark = time.time(), b'forkserver' + b' import main'\n"
        "while mark not in open(f'/proc/{second}/cmdline', 'rb').read() and time.time() - t < 30:\n"
        "    time.sleep(0.05)\n"
        "env = open(f'/proc/{second}/environ', 'rb').read().split(b'\\0')\n"
        "print(first != second, b'SCALELAB_FORK_SERVER=1' in env, b'OMP_NUM_THREADS=1' in env)\n"
        "spawn.stop_server()\n")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    assert out.stdout.split() == ["True", "True", "True"], out.stdout

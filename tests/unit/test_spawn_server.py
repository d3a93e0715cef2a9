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

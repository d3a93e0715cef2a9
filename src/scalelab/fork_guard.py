"""Imported first by launcher=local's fork server (spawn.PRELOAD), before the worker's imports.

The server dies with the command that started it (PR_SET_PDEATHSIG): when the command was killed
(`kill -9`, an OOM kill, a closed terminal's SIGHUP), the server and, through their own parent-death
signal (spawn._rank_main), the job's ranks kept running as orphans, holding their devices. And a
Ctrl-C during the server's ~3 s of imports printed its KeyboardInterrupt traceback into the
command's output: the server ignores SIGINT from the start (multiprocessing sets that only after
the imports; the command itself ends its ranks).

Only in the server (SCALELAB_FORK_SERVER set by spawn.start_server): importing it elsewhere does nothing.
"""
import os
import signal
import sys

if os.environ.get("SCALELAB_FORK_SERVER") == "1":
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    os.environ["SCALELAB_FORK_SERVER_PID"] = str(os.getpid())   # each rank's parent, to check (spawn._rank_main)
    if sys.platform.startswith("linux"):
        import ctypes

        ctypes.CDLL(None).prctl(1, ctypes.c_ulong(signal.SIGKILL))   # PR_SET_PDEATHSIG
        launcher = os.environ.get("SCALELAB_LAUNCHER_PID")
        if launcher and os.getppid() != int(launcher):   # the command died before the line above
            os._exit(0)

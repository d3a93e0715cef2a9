"""launcher=torchrun_local restarts (trainer.max_restarts): each attempt gets a rendezvous store
of its own. With torchrun's one agent-hosted store for every attempt (torch >= 2.4), a restarted
rank read the failed attempt's keys, among them the dead rank's gloo address: the restart failed
at once (connectFullMesh: Connection refused) or hung in the connect (5 min measured) instead of
resuming. End to end: tests/integration/test_elastic.py::test_torchrun_restart_after_a_rank_killed_in_a_save
(slow)."""
from pathlib import Path

from scalelab.launch import NO_SHARED_STORE, rank_env


def test_torchrun_local_ranks_get_a_store_per_attempt(monkeypatch, tmp_path):
    monkeypatch.delenv(NO_SHARED_STORE, raising=False)
    env = lambda launcher, restarts=1: rank_env(Path(tmp_path), 1, tmp_path, launcher=launcher,  # noqa: E731
                                                max_restarts=restarts)
    assert env("torchrun_local")[NO_SHARED_STORE] == "1"
    assert NO_SHARED_STORE not in env("torchrun_local", restarts=0)   # no restart: torchrun's own store
    # launcher=torchrun (nodes): scalelab.same_job reads the agent's store before any rank hosts one
    assert NO_SHARED_STORE not in env("torchrun") and NO_SHARED_STORE not in env("local")
    monkeypatch.setenv(NO_SHARED_STORE, "0")                  # the user's own setting stays
    assert env("torchrun_local")[NO_SHARED_STORE] == "0"

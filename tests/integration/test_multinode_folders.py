"""launcher=torchrun nodes that share the job's folder: one checkout on a shared file system, where
the default hydra.run.dir (outputs/runs/<time>) of nodes started in the same second is one folder,
or one hydra.run.dir given to every node. Two "nodes" on this machine (two scalelab-train
processes, one rank each, rendezvous on 127.0.0.1) given the same hydra.run.dir, as in the review
that found it (2026-12-02): node 1 replaced node 0's config_resolved.yaml (node 0's ranks then
ran with node_rank 1), printed the comparison table as if it held rank 0, marked ranks.log "run
again in this folder", and both wrote run.json through one run.json.tmp.

Now node 1 keeps its own files in JOB_DIR/node1 (its checkpoints/ a link to the job folder's, where
every rank writes its part of a checkpoint), and the same commands run again in the folder keep
the completed run (not refused as a sweep's folder for its node1/run.json).
"""
from __future__ import annotations

import json
import signal
import subprocess
import time
from pathlib import Path

import pytest
import yaml

from scalelab.launch import free_port

from ..conftest import BASE, SGD, TRAIN, env, worker_pids

pytestmark = pytest.mark.integration

STEPS = 4
COMMON = [*BASE, *SGD, "logger=none", f"trainer.max_steps={STEPS}", "data.global_batch_size=8",
          "trainer.accelerator=cpu", "strategy=ddp", "launcher=torchrun", "trainer.num_nodes=2", "trainer.devices=1",
          "launcher.rdzv_timeout_s=90", "checkpoint.every_n_steps=2"]


def _nodes(job: Path, cwd: Path, port: int, timeout: float = 240, common=COMMON) -> list[tuple[int, str]]:
    """Both nodes into one hydra.run.dir (node 1 first): [(exit code, output)] of node 0, node 1."""
    procs = {k: subprocess.Popen(TRAIN + [*common, f"launcher.rdzv_endpoint=127.0.0.1:{port}",
                                          f"launcher.node_rank={k}", f"hydra.run.dir={job}"],
                                 cwd=cwd, env=env(), stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
             for k in (1, 0)}
    out = {}
    try:
        for k in (0, 1):
            out[k] = procs[k].communicate(timeout=timeout)[0]
    finally:
        for p in procs.values():
            if p.poll() is None:
                p.kill()
    return [(procs[k].returncode, out[k]) for k in (0, 1)]


def test_nodes_sharing_one_run_dir_keep_their_own_files(tmp_path):
    job = tmp_path / "shared"
    t0 = time.monotonic()
    (rc0, out0), (rc1, out1) = _nodes(job, tmp_path, free_port())
    print(f"two nodes in one folder: {time.monotonic() - t0:.1f} s")
    assert rc0 == 0 and rc1 == 0, (out0[-3000:], out1[-3000:])
    # the job folder is node 0's: its config (which its ranks read) says node 0, its record is the run's
    cfg = yaml.safe_load((job / "config_resolved.yaml").read_text())
    assert cfg["launcher"]["node_rank"] == 0 and cfg["job"]["dir"] == str(job)
    rec = json.loads((job / "run.json").read_text())
    assert rec["status"] == "completed" and rec.get("record_on_node") is None and rec["steps"] == STEPS
    assert rec["config"]["launcher"]["node_rank"] == 0
    assert [(p["rank"], p["node_rank"]) for p in rec["placement"]] == [(0, 0), (1, 1)]
    # node 1's own: its config, its record pointing at node 0's, its log
    own = job / "node1"
    assert yaml.safe_load((own / "config_resolved.yaml").read_text())["launcher"]["node_rank"] == 1
    other = json.loads((own / "run.json").read_text())
    assert (other["status"], other["node_rank"], other["record_on_node"]) == ("completed", 1, 0)
    assert "node 1's ranks completed; the run record (figures, losses) is on node 0" in out1, out1[-2000:]
    assert "loss final" in out0 and "loss final" not in out1        # only node 0 prints the comparison
    assert (own / "ranks.log").exists() and (job / "ranks.log").exists()
    for log in (job / "ranks.log", own / "ranks.log"):
        assert "run again in this folder" not in log.read_text(), log
    assert not list(job.rglob("*.tmp")), list(job.rglob("*.tmp"))
    # one checkpoint folder for every rank's part (node 1 reaches it through its link)
    assert (own / "checkpoints").resolve() == (job / "checkpoints").resolve()
    saved = sorted(p.name for p in (job / "checkpoints").iterdir())
    assert "step-00000004.ckpt" in saved and "step-00000004.ckpt.curve-rank1.json" in saved, saved
    # compare of the job's folder: the run's record, not node 1's part as a second run
    from scalelab.results.record import read_records

    assert [r["job"]["record_path"] for r in read_records([job])] == [str(job / "run.json")]
    assert read_records([own], []) == []                               # its own folder: no run either
    assert [r["node_rank"] for r in read_records([own / "run.json"])] == [1]   # the file named itself: read

    # the same commands again: the completed run is kept on both nodes (not refused as a sweep's folder)
    (rc0, out0), (rc1, out1) = _nodes(job, tmp_path, free_port(), timeout=120)
    assert rc0 == 0 and rc1 == 0, (out0[-3000:], out1[-3000:])
    assert "record kept, nothing to run" in out0 and "record kept, nothing to run" in out1, (out0[-2000:], out1[-2000:])
    assert json.loads((job / "run.json").read_text()) == rec
    assert not worker_pids(tmp_path)


def test_a_write_never_shares_its_temporary_file(tmp_path):
    """write_json's temporary name is this process's own: another writer's half-written
    run.json.tmp (here: a folder of that name in the way) neither blocks nor is taken over."""
    from scalelab.results.record import write_json

    (tmp_path / "run.json.tmp").mkdir()
    write_json(tmp_path / "run.json", {"status": "completed"})
    assert json.loads((tmp_path / "run.json").read_text()) == {"status": "completed"}
    assert sorted(p.name for p in tmp_path.iterdir()) == ["run.json", "run.json.tmp"]


def test_a_sigterm_on_one_node_stops_both_nodes_resumably(tmp_path):
    """A pod's eviction or a spot preemption SIGTERMs one node's launcher: the ranks of both nodes
    agree on a step, save there and exit 143. The other node used to take torchrun's report of that
    for a failure: a failed run.json and exit 1, which a pod's restart policy (ExitCode) does not
    retry. Now it stops as the signalled node does: exit 143, the line saying how to go on, a
    record of the stop (status failed, "stopped by ..."); the same commands again resume both nodes from that step and complete."""
    job, steps = tmp_path / "shared", 30
    args = [a for a in COMMON if not a.startswith(("trainer.max_steps=", "checkpoint."))]
    args += [f"trainer.max_steps={steps}", "checkpoint.save=true"]
    port = free_port()
    procs = {k: subprocess.Popen(TRAIN + [*args, f"hydra.run.dir={job}", f"launcher.rdzv_endpoint=127.0.0.1:{port}", f"launcher.node_rank={k}"],
                                 cwd=tmp_path, env=env(), stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
             for k in (0, 1)}
    try:
        deadline = time.monotonic() + 180
        while not (job / ".progress").exists():     # training: the ranks have their handlers
            assert all(p.poll() is None for p in procs.values()) and time.monotonic() < deadline
            time.sleep(0.05)
        procs[1].send_signal(signal.SIGTERM)
        outs = {k: procs[k].communicate(timeout=180) for k in (0, 1)}
    finally:
        for p in procs.values():
            if p.poll() is None:
                p.kill()
    saved = sorted((job / "checkpoints").glob("step-*.ckpt"))
    assert len(saved) == 1, (saved, outs)
    again = f"the same command with hydra.run.dir={job} goes on from its checkpoint {saved[0].name}"
    for k, how, folder in ((0, "SIGTERM on another node", job), (1, "SIGTERM", job / "node1")):
        out, err = outs[k]
        assert procs[k].returncode == 143, (k, out[-2000:], err[-2000:])
        assert f"[scalelab] interrupted ({how}) in {folder}: {again}" in err, (k, err[-2000:])
        assert "FAILED" not in out + err, (k, out[-2000:], err[-2000:])
    step = int(saved[0].name[len("step-"):-len(".ckpt")])
    assert 1 <= step < steps
    for how, folder in (("SIGTERM on another node", job), ("SIGTERM", job / "node1")):   # each node's record
        rec = json.loads((folder / "run.json").read_text())
        assert (rec["status"], rec["returncode"], rec["error"]) == ("failed", 143, f"stopped by {how}"), rec
    assert json.loads((job / "run.json").read_text())["steps"] == step
    from scalelab.results.record import read_records
    assert [r["error"] for r in read_records([job])] == ["stopped by SIGTERM on another node"]   # node 1's is its part

    (rc0, out0), (rc1, out1) = _nodes(job, tmp_path, free_port(), common=args)   # the same commands again
    assert rc0 == 0 and rc1 == 0, (out0[-3000:], out1[-3000:])
    rec = json.loads((job / "run.json").read_text())
    assert (rec["status"], rec["steps"], rec["resumed_at_step"]) == ("completed", steps, step)
    assert not worker_pids(tmp_path)

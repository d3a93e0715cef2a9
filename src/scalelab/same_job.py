"""launcher=torchrun: every node of a job must run the same command (its own node rank apart).

The rendezvous id is the same on every node of a job (node 0's port and the job's number in a
sweep), so nodes whose commands differ still meet; each rank then posts its overrides to the
store torchrun's rendezvous made (MASTER_ADDR:MASTER_PORT), waits for every rank's, and all stop
with one line naming the differing overrides, before anything else: the Trainer, the device mesh
(FSDP2 / TP strategies build it in setup_environment, where mismatched nodes would wait for each
other until the collective timeout) and the model. Before, the id hashed the overrides
themselves: nodes that differed in any value (even node 0 given launcher.rdzv_endpoint and node 1
reading MASTER_ADDR/MASTER_PORT, as the README allows) waited out launcher.rdzv_timeout_s (15 min
by default) and then blamed the rendezvous.
"""
from __future__ import annotations

import hashlib
import json
import os
import socket
from pathlib import Path

# A node's own settings, free to differ: its rendezvous keys (node rank; endpoint given or read
# from the environment; its timeout), where it writes (hydra.run.dir, hydra.sweep.dir, cache_dir),
# what it prints and logs (only global rank 0 logs), and its host resources and time limits.
NODE_OWN = ("launcher.", "hydra.", "verbose", "cache_dir", "logger", "trainer.timeout_s",
            "trainer.collective_timeout_s", "trainer.threads_per_rank", "trainer.enable_progress_bar",
            "data.num_workers")
# ...of which what a run measures all the same: a logger's per-step work is in the step time (csv:
# ~0.6 ms a step), so which logger (and W&B's mode) makes another series in a sweep (results.sweep).
# It is still the same job (job_dir.FREE): a run resumes, or its completed record is kept and the
# rerun says so, whichever logger the same command gives.
MEASURED_LOGGER = ("logger.name", "logger.mode")


def shared_overrides(overrides: list[str]) -> dict[str, str]:
    """KEY -> VALUE of the overrides every node must share (`+k=v` and `k=v` alike; `~k` deletes)."""
    out = {}
    for o in overrides:
        key, _, value = str(o).partition("=")
        name = key.lstrip("+")
        if not name.lstrip("~").startswith(NODE_OWN):
            out[name] = value
    return out


def shared_config(cfg: dict) -> dict[str, str]:
    """KEY -> JSON value of the resolved config every node must share: all of it but a node's own
    keys and its job fields (its folder, cores, prepared data's path). Nodes with the same overrides
    composed their own conf/ (another checkout, an edited yaml, SCALELAB_CONF_DIR): one node at
    optim.lr 0.3 beside 0.003 completed, its replicas apart, and run.json named node 0's LR."""
    from scalelab.results.record import scrub
    from scalelab.results.table import flatten

    return {k: json.dumps(v, sort_keys=True, default=str) for k, v in flatten(scrub(cfg)).items()
            if not k.startswith((*NODE_OWN, "job."))}


def rdzv_id(endpoint: str, num: int) -> str:
    """The same id on every node of a job: node 0's port and the job's number in its sweep. Not
    its host: node 0 may name itself localhost while node 1 reaches it as node0 or by address."""
    port = str(endpoint).rpartition(":")[2]
    return "scalelab-" + hashlib.sha1(f"{port}\n{num}".encode()).hexdigest()[:12]


def difference(mine: dict[str, str], theirs: dict[str, str]) -> list[str]:
    """`KEY: A vs B` for every key whose value differs (`-` where a node has no such override)."""
    return [f"{k}: {mine.get(k, '-')} vs {theirs.get(k, '-')}" for k in sorted(set(mine) | set(theirs))
            if mine.get(k) != theirs.get(k)]


def check(overrides: list[str], node_rank: int, timeout_s: float, environ=None,
          resume: tuple[str | None, int | None] = (None, None),
          accelerator: str | None = None, data: str | None = None,
          config: dict | None = None) -> tuple[str | None, int | None]:
    """Post this rank's overrides to the rendezvous store, wait for every rank's, and raise one line
    (RuntimeError) when any node's differ from global rank 0's. The ranks' torchrun environment
    (RANK, WORLD_SIZE, MASTER_ADDR, MASTER_PORT) names the store.
    `accelerator`: what this rank runs on (cpu / gpu); each node's launcher resolved
    trainer.accelerator=auto itself, so one where CUDA failed ran its ranks on cpu and gloo beside
    the others' NCCL, with the same overrides, and the job hung in its first collective until
    trainer.collective_timeout_s: every node stops instead, in one line naming the one that differs.
    `data`: the data this rank prepared (prepare.data_identity): each node read its own files, and
    the same override (data.files=notes.txt) on nodes whose disks hold other files trained each node's
    replicas on other data, silently; every node stops instead, in one line.
    `config`: this rank's resolved config (shared_config: what its conf/ files made of the overrides).
    Returns global rank 0's `resume` (checkpoint path, step): every rank goes on from the one rank
    0 chose. Each node found its own in its own job folder, where only node 0's has checkpoints:
    node 0 resumed and the others started over (a hang, or replicas apart; found by review)."""
    from datetime import timedelta

    import torch.distributed as dist

    env = os.environ if environ is None else environ
    rank, world = int(env["RANK"]), int(env["WORLD_SIZE"])
    wait = timedelta(seconds=float(timeout_s))
    store = dist.TCPStore(env["MASTER_ADDR"], int(env["MASTER_PORT"]), is_master=False, timeout=wait)
    prefix = f"scalelab/same_job/{env.get('TORCHELASTIC_RESTART_COUNT', '0')}/"
    store.set(f"{prefix}{rank}", json.dumps([int(node_rank), shared_overrides(overrides), list(resume),
                                             accelerator, socket.gethostname(), data,
                                             None if config is None else shared_config(config)]))
    keys = [f"{prefix}{r}" for r in range(world)]
    store.wait(keys, wait)
    every = [json.loads(store.get(k)) + [None, None, None, None] for k in keys]   # (a rank that posted fewer)
    node0, ref, chosen, acc0, host0, data0, config0 = every[0][:7]
    for node, theirs, *_ in every:
        diff = difference(ref, theirs)
        if diff:
            raise RuntimeError(f"node {node} runs another command than node {node0} (node {node0} vs node {node}: "
                               f"{'; '.join(diff)[:400]}): every node must run the same scalelab-train overrides, "
                               "with its own launcher.node_rank")
    for node, _, _, _, host, _, theirs, *_ in every:
        diff = difference(config0, theirs) if theirs is not None and config0 is not None else []
        if diff:
            raise RuntimeError(f"node {node} (host {host}) composed another config than node {node0} (host {host0}) "
                               f"from the same overrides (node {node0} vs node {node}: {'; '.join(diff)[:400]}): "
                               "every node must run the same ScaleLab checkout and conf/ files (SCALELAB_CONF_DIR "
                               "too)")
    for node, _, _, acc, host, *_ in every:
        if acc is not None and acc0 is not None and acc != acc0:
            cpu_node = node if acc == "cpu" else node0   # where CUDA did not come up, as a rule
            raise RuntimeError(f"node {node} (host {host}) runs on {acc} but node {node0} (host {host0}) on {acc0}: "
                               "each node's scalelab-train resolved trainer.accelerator itself, and every node must "
                               f"run on the same one: check node {cpu_node}'s GPUs and driver (nvidia-smi), or run "
                               "every node with trainer.accelerator=cpu")
    for node, _, _, _, host, theirs, *_ in every:
        if theirs is not None and data0 is not None and theirs != data0:
            raise RuntimeError(f"node {node} (host {host}) prepared other data than node {node0} (host {host0}): "
                               f"{theirs} vs {data0}: every node must read the same data, split alike (the same "
                               "files at the data.files / data.hub_name paths on every node, or one shared copy, "
                               "named the same way from the same relative working directory; data=stdlib: the "
                               "same Python on every node)")
    path, step = chosen
    if path is None:
        return path, step
    # every rank says whether it sees rank 0's checkpoint, and all stop if one does not (the
    # others would wait in the process group's start for the collective timeout)
    store.set(f"{prefix}sees/{rank}", json.dumps([int(node_rank), Path(path).exists()]))
    seen = [f"{prefix}sees/{r}" for r in range(world)]
    store.wait(seen, wait)
    blind = sorted({n for n, ok in (json.loads(store.get(k)) for k in seen) if not ok})
    if blind:
        raise RuntimeError(f"node(s) {', '.join(map(str, blind))} cannot see {path}, the checkpoint global rank 0 "
                           "resumes from: resuming a multi-node job needs its checkpoints (every rank's shards) on a "
                           "file system every node shares, in one job folder path")
    return path, step

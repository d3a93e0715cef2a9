"""Where a job's ranks meet: under SLURM, the MASTER_ADDR / MASTER_PORT the batch step gives every
rank (master_env); with launcher=torchrun, this node's rendezvous endpoint, node rank and backend
(torchrun_layout); on one machine, a free local port (free_port). No torch here: the launcher
imports it."""
from __future__ import annotations

import os

from scalelab.slurm_env import STEP_ENV, expand_nodelist, requeue_count


def master_env(environ=None) -> dict[str, str]:
    """MASTER_ADDR = the allocation's first node, where the batch step runs (sbatch(1): "on the
    first node in the set of allocated nodes") and global rank 0 with it; MASTER_PORT a port free
    there now (15000-31999), picked per attempt by the batch step, which gives every rank of every
    node the same pair. Not Lightning's 15000 + the job id's last 4 digits: two jobs whose ids
    agree there (a day apart on a busy cluster, or any Lightning job) could not both bind it on a
    shared node, and a requeue kept the clash."""
    import socket

    env = os.environ if environ is None else environ
    nodes = env.get("SLURM_JOB_NODELIST") or env.get("SLURM_NODELIST") or "127.0.0.1"
    # below Linux's ephemeral range (32768-60999: any outgoing connection may take one of those
    # before rank 0's store binds it), starting where the job id and attempt point, first free
    job = int(str(env.get("SLURM_JOB_ID") or "0")[-6:] or 0) + 7919 * requeue_count(env)
    port = None
    for i in range(1000):
        candidate = 15000 + (job + i) % 17000
        with socket.socket() as s:
            try:
                s.bind(("", candidate))   # every interface, as rank 0's store binds it
            except OSError:
                continue
        port = candidate
        break
    return {"MASTER_ADDR": expand_nodelist(nodes)[0], "MASTER_PORT": str(port or 15000 + job % 17000), STEP_ENV: "1"}


RDZV_BACKENDS = ("static",)
# Where a node finds the rendezvous when launcher.rdzv_endpoint / node_rank are null, in order:
# a Kubernetes PyTorchJob sets MASTER_ADDR, MASTER_PORT, RANK (the pod's = node's rank) and
# WORLD_SIZE (pods); PET_* are the operator's torchrun variables; NODE_RANK / GROUP_RANK the usual.
_ADDR_VARS, _PORT_VARS = ("PET_MASTER_ADDR", "MASTER_ADDR"), ("PET_MASTER_PORT", "MASTER_PORT")
_NODE_RANK_VARS = ("PET_NODE_RANK", "NODE_RANK", "GROUP_RANK", "RANK")


def parse_endpoint(value, key: str) -> tuple[str, int]:
    """HOST:PORT (an IPv6 host in brackets) -> (host, port); ConfigError naming `key` otherwise."""
    from scalelab.errors import ConfigError

    text = str(value).strip() if isinstance(value, str) else None
    host, sep, port = (text or "").rpartition(":")
    ok = bool(text) and bool(sep) and bool(host.strip("[]")) and port.isdigit() and 1 <= int(port) <= 65535 \
        and not any(c.isspace() for c in text)
    if not ok:
        raise ConfigError(f"{key}={value!r} must be HOST:PORT with a port in 1-65535 (node 0's address, the same "
                          "on every node, e.g. node0.example.com:29500)")
    return host, int(port)


def torchrun_layout(launcher, nodes: int, environ=None, require: bool = True) -> dict:
    """launcher=torchrun: this node's rendezvous {"endpoint", "node_rank", "backend", "timeout_s",
    "rdzv_id"}, from the launcher keys or, where they are null, the environment. require=False
    (checking a job for another machine: `scalelab plan`, `scalelab k8s render`): check only the
    values given. Any bad or missing value is a one-line ConfigError."""
    from scalelab.errors import ConfigError

    env = os.environ if environ is None else environ
    get = (lambda k, d=None: launcher.get(k, d)) if hasattr(launcher, "get") else (lambda k, d=None: d)
    backend = get("rdzv_backend", "static")
    if backend not in RDZV_BACKENDS:   # c10d too (schema.py says why: rank 0 could be on any node)
        raise ConfigError(f"launcher.rdzv_backend={backend!r} is not valid: choose one of {', '.join(RDZV_BACKENDS)}")
    timeout = get("rdzv_timeout_s", 900)
    if isinstance(timeout, bool) or not isinstance(timeout, (int, float)) or timeout <= 0:
        raise ConfigError(f"launcher.rdzv_timeout_s={timeout!r} must be a number > 0 (seconds a node waits for "
                          "the others to join)")
    endpoint = get("rdzv_endpoint")
    if endpoint is not None:
        parse_endpoint(endpoint, "launcher.rdzv_endpoint")
    elif require:
        addr = next((env[k] for k in _ADDR_VARS if env.get(k)), None)
        port = next((env[k] for k in _PORT_VARS if env.get(k)), None)
        if addr and port:
            endpoint = f"{addr}:{port}"
            parse_endpoint(endpoint, "MASTER_ADDR:MASTER_PORT")
        elif nodes == 1:
            endpoint = f"127.0.0.1:{free_port()}"
        else:
            raise ConfigError(f"launcher=torchrun with trainer.num_nodes={nodes} needs the rendezvous endpoint: set "
                              "launcher.rdzv_endpoint=HOST:PORT (node 0's address, the same on every node) or "
                              "MASTER_ADDR and MASTER_PORT")
    node_rank, key = get("node_rank"), "launcher.node_rank"
    if node_rank is None and require:
        var = next((k for k in _NODE_RANK_VARS if env.get(k, "").strip()), None)
        if var is not None:
            node_rank, key = env[var].strip(), var
            node_rank = int(node_rank) if node_rank.isdigit() else node_rank
        elif nodes == 1:
            node_rank = 0
        else:
            raise ConfigError(f"launcher=torchrun with trainer.num_nodes={nodes} needs this node's rank: set "
                              "launcher.node_rank=K (0 on the endpoint's host, 1..N-1 on the others) or NODE_RANK")
    if node_rank is not None and (isinstance(node_rank, bool) or not isinstance(node_rank, int)
                                  or not 0 <= node_rank < nodes):
        raise ConfigError(f"{key}={node_rank!r} must be an integer in [0, {nodes}) (trainer.num_nodes={nodes})")
    return {"endpoint": endpoint, "node_rank": node_rank, "backend": backend, "timeout_s": timeout,
            "rdzv_id": get("rdzv_id")}


def free_port() -> int:
    """A TCP port free on 127.0.0.1 now (a rendezvous or store for ranks on this machine)."""
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]

"""launcher=torchrun: every node of a job must run the same command (its own node rank apart).

The rendezvous id is the same on every node of a job (the endpoint and the job's number in a
sweep), so nodes whose commands differ still meet; their ranks then compare their commands first
thing after the process group forms (Lightning's setup hook, before the model is built) and stop
with one line naming the differing overrides. Before, the id hashed the overrides themselves:
nodes that differed in any value (even node 0 given launcher.rdzv_endpoint and node 1 reading
MASTER_ADDR/MASTER_PORT, as the README allows) waited out launcher.rdzv_timeout_s (15 min by
default) and then blamed the rendezvous.
"""
from __future__ import annotations

import hashlib

# A node's own settings: its rendezvous keys (node rank; endpoint given or read from the
# environment; its timeout) and where it writes (hydra.run.dir, hydra.sweep.dir).
NODE_OWN = ("launcher.", "hydra.")


def shared_overrides(overrides: list[str]) -> dict[str, str]:
    """KEY -> VALUE of the overrides every node must share (Hydra's +/++/~ prefixes kept in KEY)."""
    out = {}
    for o in overrides:
        key, _, value = str(o).partition("=")
        if not key.lstrip("+~").startswith(NODE_OWN):
            out[key] = value
    return out


def rdzv_id(endpoint: str, num: int) -> str:
    """The same id on every node of a job: node 0's endpoint and the job's number in its sweep."""
    return "scalelab-" + hashlib.sha1(f"{endpoint}\n{num}".encode()).hexdigest()[:12]


def difference(mine: dict[str, str], theirs: dict[str, str]) -> list[str]:
    """`KEY: A vs B` for every key whose value differs (`-` where a node has no such override)."""
    return [f"{k}: {mine.get(k, '-')} vs {theirs.get(k, '-')}" for k in sorted(set(mine) | set(theirs))
            if mine.get(k) != theirs.get(k)]


def check_callback(overrides: list[str], node_rank: int):
    """A Lightning callback that compares this rank's command with every other rank's once the
    process group exists (its setup hook) and raises one line when they differ. Lightning is
    imported here: the launcher imports this module for rdzv_id and never imports Lightning."""
    import lightning as L

    shared, mine = shared_overrides(overrides), int(node_rank)

    class SameJobOnEveryNode(L.Callback):
        def setup(self, trainer, pl_module, stage: str) -> None:
            import torch.distributed as dist

            if not (dist.is_available() and dist.is_initialized()):
                return
            every: list = [None] * dist.get_world_size()
            dist.all_gather_object(every, (mine, shared))
            node0, ref = every[0]
            for node, theirs in every:
                diff = difference(ref, theirs)
                if diff:
                    raise RuntimeError(f"node {node} runs another command than node {node0} (node {node0} vs node "
                                       f"{node}: {'; '.join(diff)[:400]}): every node must run the same "
                                       "scalelab-train overrides, with its own launcher.node_rank")

    return SameJobOnEveryNode()

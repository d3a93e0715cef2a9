"""launcher=torchrun: each node's launcher resolves trainer.accelerator=auto itself; a node where CUDA
failed ran cpu/gloo beside the others' NCCL with the same overrides. same_job.check stops every node
in one line naming the one that differs."""
import threading
from datetime import timedelta

import torch.distributed as dist

from scalelab import same_job
from scalelab.launch import free_port


def _two_nodes(accelerators) -> list:
    port = free_port()
    master = dist.TCPStore("127.0.0.1", port, is_master=True, timeout=timedelta(seconds=30), wait_for_workers=False)
    errors: list = [None, None]

    def rank(r: int) -> None:
        env = {"RANK": str(r), "WORLD_SIZE": "2", "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(port)}
        try:
            same_job.check(["strategy=ddp"], node_rank=r, timeout_s=30, environ=env, accelerator=accelerators[r])
        except BaseException as e:  # noqa: BLE001
            errors[r] = e

    threads = [threading.Thread(target=rank, args=(r,)) for r in (1, 0)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=60)
    del master
    return errors


def test_a_node_on_another_accelerator_stops_every_node_naming_it():
    assert _two_nodes(["gpu", "gpu"]) == [None, None]
    errors = _two_nodes(["gpu", "cpu"])
    for e in errors:
        assert isinstance(e, RuntimeError), errors
        assert str(e).startswith("node 1 (host ") and " runs on cpu but node 0 (host " in str(e), str(e)
        assert str(e).count("\n") == 0 and "check node 1's GPUs" in str(e)

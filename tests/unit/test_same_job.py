"""launcher=torchrun: what every node must share (scalelab.same_job), checked through a real
TCPStore as torchrun's rendezvous hosts it (two ranks as threads, one per "node")."""
from __future__ import annotations

import threading
from datetime import timedelta

import torch.distributed as dist

from scalelab import same_job
from scalelab.launch import free_port


def test_a_nodes_own_keys_may_differ_and_prefixes_do_not_count():
    got = same_job.shared_overrides(["+seed=7", "++optim.lr=0.1", "verbose=true", "launcher.node_rank=1",
                                     "launcher.rdzv_endpoint=n0:29500", "logger=none", "cache_dir=/scratch/x",
                                     "trainer.timeout_s=60", "trainer.max_steps=5", "~model.arch.dropout"])
    assert got == {"seed": "7", "optim.lr": "0.1", "trainer.max_steps": "5", "~model.arch.dropout": ""}


def test_the_rendezvous_id_is_node_0s_port_and_the_job_number():
    a = same_job.rdzv_id("localhost:29500", 0)
    assert a == same_job.rdzv_id("10.0.0.1:29500", 0) == same_job.rdzv_id("node0.example.com:29500", 0)
    assert len({a, same_job.rdzv_id("localhost:29500", 1), same_job.rdzv_id("localhost:29501", 0)}) == 3


def _two_ranks(overrides: list[list[str]], resumes=((None, None), (None, None)), returned: list | None = None,
               accelerators=("cpu", "cpu"), configs=(None, None)) -> list[BaseException | None]:
    """Each rank's error (None: it passed); `returned` gets what check returned to each."""
    port = free_port()
    master = dist.TCPStore("127.0.0.1", port, is_master=True, timeout=timedelta(seconds=30), wait_for_workers=False)
    errors: list[BaseException | None] = [None, None]
    returned = returned if returned is not None else [None, None]

    def rank(r: int) -> None:
        env = {"RANK": str(r), "WORLD_SIZE": "2", "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(port)}
        try:
            returned[r] = same_job.check(overrides[r], node_rank=r, timeout_s=30, environ=env, resume=resumes[r],
                                         accelerator=accelerators[r], config=configs[r])
        except BaseException as e:  # noqa: BLE001
            errors[r] = e

    threads = [threading.Thread(target=rank, args=(r,)) for r in (1, 0)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=60)
    del master
    return errors


def test_the_same_command_passes_and_another_stops_every_rank_naming_the_keys():
    assert _two_ranks([["strategy=ddp", "launcher.node_rank=0"], ["strategy=ddp", "launcher.node_rank=1",
                                                                  "verbose=true"]]) == [None, None]
    errors = _two_ranks([["strategy=ddp"], ["strategy=fsdp", "+seed=7"]])
    for e in errors:
        assert isinstance(e, RuntimeError)
        assert str(e).startswith("node 1 runs another command than node 0 (node 0 vs node 1: seed: - vs 7; "
                                 "strategy: ddp vs fsdp)")


def test_difference_reads_both_sides():
    assert same_job.difference({"k": "a,b"}, {"k": "a,b"}) == []
    assert same_job.difference({"k": "a,b", "j": "1"}, {"j": "2"}) == ["j: 1 vs 2", "k: a,b vs -"]


def test_every_rank_goes_on_from_rank_0s_checkpoint_or_all_stop(tmp_path):
    """Rank 0's choice is every rank's (each node looked in its own folder); a checkpoint some rank
    cannot see stops all of them, not only the blind ones (the others would wait out the timeout)."""
    ckpt = tmp_path / "step-00000002.ckpt"
    ckpt.write_text("x")
    for given, ok in ((str(ckpt), True), (str(tmp_path / "gone.ckpt"), False)):
        out: list = [None, None]
        # node 1's own folder has no checkpoint
        errors = _two_ranks([["strategy=ddp"]] * 2, resumes=((given, 2), (None, None)), returned=out)
        if ok:
            assert errors == [None, None] and out == [(str(ckpt), 2), (str(ckpt), 2)]
        else:
            assert all(isinstance(e, RuntimeError) and str(e).startswith("node(s) 0, 1 cannot see") for e in errors), errors


def test_a_node_on_another_accelerator_stops_every_node_naming_it():
    """Each node's launcher resolves trainer.accelerator=auto itself: a node where CUDA failed ran
    cpu/gloo beside the others' NCCL with the same overrides. Every node stops, naming it."""
    same = [["strategy=ddp"], ["strategy=ddp"]]
    assert _two_ranks(same, accelerators=("gpu", "gpu")) == [None, None]
    errors = _two_ranks(same, accelerators=("gpu", "cpu"))
    for e in errors:
        assert isinstance(e, RuntimeError), errors
        assert str(e).startswith("node 1 (host ") and " runs on cpu but node 0 (host " in str(e), str(e)
        assert str(e).count("\n") == 0 and "check node 1's GPUs" in str(e)


def test_the_same_overrides_composed_into_another_config_stop_every_node_naming_the_keys():
    """Node 1's conf/ said optim.lr 0.3 (another checkout, an edited yaml): its overrides were node
    0's, so the job completed with its replicas apart and run.json named node 0's LR."""
    cfg = {"optim": {"lr": 0.003, "name": "adamw"}, "seed": 1, "launcher": {"node_rank": 0}, "cache_dir": "/a",
           "job": {"dir": "/jobs/a", "host_cores": 16}, "logger": {"api_key": "s3cret"}}
    node1 = {**cfg, "launcher": {"node_rank": 1}, "cache_dir": "/b", "job": {"dir": "/jobs/a/node1", "host_cores": 8},
             "logger": {"api_key": "other"}}
    assert _two_ranks([["strategy=ddp"], ["strategy=ddp"]], configs=(cfg, node1)) == [None, None]  # a node's own
    errors = _two_ranks([["strategy=ddp"], ["strategy=ddp"]], configs=(cfg, {**node1, "optim": {"lr": 0.3,
                                                                                               "name": "adamw"}}))
    for e in errors:
        assert isinstance(e, RuntimeError)
        assert str(e).startswith("node 1 (host ") and "composed another config than node 0" in str(e)
        assert "from the same overrides (node 0 vs node 1: optim.lr: 0.003 vs 0.3): every node must run the same " \
               "ScaleLab checkout and conf/ files" in str(e), str(e)

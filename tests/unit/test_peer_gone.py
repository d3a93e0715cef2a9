"""launcher=torchrun: a rank whose peer on another node died first fails with the transport's
error (gloo: 'Connection reset by peer'), naming nothing on the node that failed; the job's error
then says the first failure may be on another node (scalelab.launch.PEER_GONE)."""
import pytest

from scalelab.launch import PEER_GONE


@pytest.mark.parametrize("error,gone", [
    # measured: node 1 killed (SIGKILL) at step 102 of a 2-node ddp run, node 0's rank 0
    ("error-rank0: RuntimeError: [../third_party/gloo/gloo/transport/tcp/pair.cc:537] Read error "
     "[127.0.0.1]:7082: Connection reset by peer", True),
    ("error-rank1: RuntimeError: [/pytorch/third_party/gloo/gloo/transport/tcp/pair.cc:534] Connection closed by peer "
     "[127.0.0.1]:22473", True),
    ("error-rank0: torch.distributed.DistBackendError: NCCL communicator was aborted on rank 0.", True),
    ("error-rank0: RuntimeError: node 1 runs another command than node 0 (node 0 vs node 1: seed: - vs 7)", False),
    ("error-rank3: ValueError: loss is nan", False),
])
def test_a_peer_gone_is_told_apart(error, gone):
    assert bool(PEER_GONE.search(error)) is gone


def test_a_node_whose_rank_lost_its_peer_does_not_say_it_failed_first(tmp_path):
    """Node 1 killed: node 0's error read 'rank 0 failed first (exit code 1): ... Connection closed by
    peer', while the first failure was on node 1 (the hint after it said so)."""
    from scalelab.job_outcome import failed_on_node

    (tmp_path / "error-rank0.txt").write_text("RuntimeError: Connection closed by peer [127.0.0.1]:22473\n")
    record = {"error": "rank 0 failed first (exit code 1): RuntimeError: Connection closed by peer [127.0.0.1]:22473",
              "resumed_at_step": None}
    failed_on_node(record, tmp_path, {"node_rank": 0, "endpoint": "127.0.0.1:29500"})
    assert record["error"] == ("rank 0 failed on this node (exit code 1): RuntimeError: Connection closed by peer "
                               "[127.0.0.1]:22473 (a peer's connection ended: the rank that failed first may be on "
                               "another node, whose ranks.log says why)")

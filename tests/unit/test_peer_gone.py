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

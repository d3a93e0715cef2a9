"""Nodes with a job folder each (scalelab k8s --pvc: node${RANK}; torchrun nodes given their own
hydra.run.dir): a rank that is not global rank 0 writes its loss curve beside the checkpoint in its
own node's folder, whose checkpoints/ only rank 0 used to create (node 1 crashed at the first
periodic checkpoint: FileNotFoundError ... step-00000010.ckpt.curve-rank1.json)."""
import json
from types import SimpleNamespace

from scalelab.checkpointing import PeriodicCheckpoint


def test_a_rank_of_another_node_writes_its_curve_into_its_own_folder(tmp_path):
    node1 = tmp_path / "node1"
    node1.mkdir()
    saved = []
    trainer = SimpleNamespace(is_global_zero=False, global_rank=1, strategy=SimpleNamespace(barrier=lambda: None),
                              save_checkpoint=lambda path, weights_only=False: saved.append(path))
    cb = PeriodicCheckpoint(node1, every=10, keep=2)
    cb.curve_of = lambda: {"global_steps": [1, 2], "losses": [5.0, 4.0]}
    cb.save(trainer, 10)
    curve = node1 / "checkpoints" / "step-00000010.ckpt.curve-rank1.json"
    assert json.loads(curve.read_text())["losses"] == [5.0, 4.0] and saved

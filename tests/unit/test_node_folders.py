"""train.node_folder: where node K > 0 of a torchrun job keeps its files, and that its checkpoints/
is node 0's, so the ranks of every node write their parts of one checkpoint into one folder (rank
0 renames, lists and prunes it; a resume on every node reads it)."""
from __future__ import annotations

import os

from scalelab.train import node_folder


def test_a_shared_job_folder_gives_node_k_its_own_folder_with_the_job_s_checkpoints(tmp_path):
    job = tmp_path / "job"
    job.mkdir()
    assert node_folder(job, 0) == job
    own = node_folder(job, 1)
    assert own == job / "node1" and os.readlink(own / "checkpoints") == "../checkpoints"
    assert (own / "checkpoints").resolve() == (job / "checkpoints").resolve()


def test_a_folder_given_per_node_links_to_node_0_s_checkpoints(tmp_path):
    # scalelab k8s --pvc: hydra.run.dir=NAME/node${RANK}; node 1's pipeline shards stayed in NAME/node1
    name = tmp_path / "NAME"
    (name / "node1").mkdir(parents=True)
    own = node_folder(name / "node1", 1)
    assert own == name / "node1" and os.readlink(own / "checkpoints") == "../node0/checkpoints"
    (own / "checkpoints" / "step-00000010.ckpt.tmp").mkdir()          # a rank of node 1 writes its part
    assert (name / "node0" / "checkpoints" / "step-00000010.ckpt.tmp").is_dir()
    assert node_folder(name / "node0", 0) == name / "node0"            # node 0: its own folder, no link
    assert not (name / "node0" / "checkpoints").is_symlink()


def test_a_sweep_folder_given_per_node_links_each_job_to_node_0_s_job(tmp_path):
    # review 2026-12-04: hydra.sweep.dir=NAME/node${RANK} made node 1's job 0 NAME/node1/0/node1, its
    # checkpoints NAME/node1/0's and its loss curves beside no checkpoint node 0 kept or pruned
    name = tmp_path / "NAME"
    (name / "node1" / "0").mkdir(parents=True)
    own = node_folder(name / "node1" / "0", 1)
    assert own == name / "node1" / "0" and os.readlink(own / "checkpoints") == "../../node0/0/checkpoints"
    (own / "checkpoints" / "step-00000010.ckpt.curve-rank1.json").write_text("[]")
    assert (name / "node0" / "0" / "checkpoints" / "step-00000010.ckpt.curve-rank1.json").is_file()
    (tmp_path / "sw" / "0").mkdir(parents=True)
    assert node_folder(tmp_path / "sw" / "0", 1) == tmp_path / "sw" / "0" / "node1"   # one shared sweep folder


def test_a_k8s_job_or_sweep_is_grouped_by_its_name_not_its_node_folder():
    from pathlib import Path

    from scalelab.train import job_group

    name = Path("/pvc/scalelab/myjob")
    assert job_group("torchrun", name / "node0", None) == "myjob"                 # a run: NAME/node0
    assert job_group("torchrun", name / "node0" / "3", name / "node0") == "myjob"  # a sweep: was "node0"
    assert job_group("local", Path("/o/sweeps/t/node0"), Path("/o/sweeps/t/node0").parent) == "t"
    assert job_group("local", Path("/o/runs/node0"), None) == "node0"             # not a node's folder there

"""SLURM's compressed host lists (SLURM_JOB_NODELIST) expanded as `scontrol show hostnames` does:
every bracket group of a name, the first one slowest, zero padding kept, commas inside and
outside brackets. The first host is MASTER_ADDR (requeue.master_env); the list is gloo's fallback
(requeue.gloo_interface) and run.json's slurm.nodes. Before, only a name's first bracket group
expanded: rack[1-2]-n[01-02] gave rack1-n[01-02] and rack2-n[01-02], which no host is."""
from __future__ import annotations

import pytest

from scalelab.requeue import expand_nodelist, master_env, slurm_info


@pytest.mark.parametrize("nodelist,hosts", [
    ("node1", ["node1"]),
    ("node1,node2", ["node1", "node2"]),
    ("gpu[07-08,10],login1", ["gpu07", "gpu08", "gpu10", "login1"]),
    ("n[8-11]", ["n8", "n9", "n10", "n11"]),
    ("n[098-101]", ["n098", "n099", "n100", "n101"]),
    ("rack[1-2]-n[01-02]", ["rack1-n01", "rack1-n02", "rack2-n01", "rack2-n02"]),
    ("r[1,3]c[2-3]n[7]", ["r1c2n7", "r1c3n7", "r3c2n7", "r3c3n7"]),
    ("rack[1-2]-n[01-02],login1,gpu[3]-ib", ["rack1-n01", "rack1-n02", "rack2-n01", "rack2-n02", "login1",
                                             "gpu3-ib"]),
    ("c1-[1-2]-gpu", ["c1-1-gpu", "c1-2-gpu"]),
    ("a[1-2]b,c[01,03-04]d[9-10]", ["a1b", "a2b", "c01d9", "c01d10", "c03d9", "c03d10", "c04d9", "c04d10"]),
    ("", []),
])
def test_every_bracket_group_expands(nodelist, hosts):
    assert expand_nodelist(nodelist) == hosts


def test_the_first_node_of_a_two_dimensional_list_is_the_master():
    env = {"SLURM_JOB_ID": "42", "SLURM_JOB_NODELIST": "rack[3-4]-n[07-08]"}
    assert master_env(env)["MASTER_ADDR"] == "rack3-n07"
    assert slurm_info(env)["nodes"] == ["rack3-n07", "rack3-n08", "rack4-n07", "rack4-n08"]

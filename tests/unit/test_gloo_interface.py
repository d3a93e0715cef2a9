"""The SLURM flag group (requeue.RequeueOnSignal: gloo beside NCCL) on several nodes binds gloo to
the interface that reaches the other nodes, not the loopback one a hostname may resolve to
(requeue.gloo_interface sets GLOO_SOCKET_IFNAME). Expected interfaces come from `ip -o -4 addr`."""
from __future__ import annotations

import shutil
import subprocess

import pytest

from scalelab.requeue import gloo_interface, interface_to


def _addresses() -> dict[str, str]:
    """{IPv4 address: interface} as iproute2 lists them."""
    if not shutil.which("ip"):
        pytest.skip("no iproute2 `ip` here to say which interface holds which address")
    out = subprocess.run(["ip", "-o", "-4", "addr", "show"], capture_output=True, text=True, check=True).stdout
    return {f[3].split("/")[0]: f[1] for f in (ln.split() for ln in out.splitlines())}


def _outside() -> tuple[str, str]:
    outside = [(ip, name) for ip, name in _addresses().items() if name != "lo"]
    if not outside:
        pytest.skip("this host has no IPv4 interface besides loopback")
    return outside[0]


def test_the_interface_is_the_one_holding_the_routed_address():
    ip, name = _outside()
    assert interface_to(ip) == name
    assert interface_to("127.0.0.1") == "lo"
    assert interface_to("no-such-host.invalid") is None


def test_a_multi_node_job_binds_gloo_to_the_master_s_route():
    ip, name = _outside()
    env = {"MASTER_ADDR": ip}
    gloo_interface(2, env)
    assert env["GLOO_SOCKET_IFNAME"] == name


def test_on_the_master_node_a_loopback_name_asks_the_other_nodes():
    ip, name = _outside()
    env = {"MASTER_ADDR": "127.0.0.1", "SLURM_JOB_NODELIST": f"localhost,{ip}"}
    gloo_interface(2, env)
    assert env["GLOO_SOCKET_IFNAME"] == name


@pytest.mark.parametrize("nodes,env", [(1, {"MASTER_ADDR": "x"}),
                                       (2, {"GLOO_SOCKET_IFNAME": "ib0", "MASTER_ADDR": "x"})])
def test_left_alone_on_one_node_or_when_set(nodes, env):
    before = dict(env)
    gloo_interface(nodes, env)
    assert env == before


def _default_route_interface() -> str:
    if not shutil.which("ip"):
        pytest.skip("no iproute2 `ip` here to say which interface holds the default route")
    fields = subprocess.run(["ip", "-4", "route", "show", "default"], capture_output=True, text=True).stdout.split()
    if "dev" not in fields:
        pytest.skip("this host has no IPv4 default route")
    return fields[fields.index("dev") + 1]


@pytest.mark.parametrize("master", ["127.0.0.1", "localhost", "own-name"])
def test_on_node_0_with_only_loopback_names_the_default_route_s_interface(master):
    """launcher=torchrun's node 0 (no node list; MASTER_ADDR is itself, e.g. its hostname resolving
    to 127.0.1.1): gloo binds the default route's interface, not loopback (then only a lone node ran)."""
    import socket

    name = _default_route_interface()
    if master == "own-name":
        master = socket.gethostname()
        if interface_to(master) != "lo":
            pytest.skip(f"this host's name {master} does not resolve to loopback here")
    env = {"MASTER_ADDR": master}
    line = gloo_interface(2, env)
    assert env["GLOO_SOCKET_IFNAME"] == name
    assert line.startswith(f"[scalelab] GLOO_SOCKET_IFNAME={name} (the default route's interface): "
                           f"MASTER_ADDR={master}"), line

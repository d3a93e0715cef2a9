"""A multi-node job whose node names all route via loopback on this node still binds gloo to an
interface the other nodes can reach. launcher=torchrun has no SLURM node list, and on node 0
MASTER_ADDR is node 0 itself (README: launcher.rdzv_endpoint=node0:29500 on node0), whose name
resolves to 127.0.1.1 with Debian's /etc/hosts: every candidate gave `lo`, GLOO_SOCKET_IFNAME
stayed unset and gloo bound loopback, so the other nodes could not connect. Now: the default
route's interface, else the first one up, and one line saying so. Fakes stand in for the host's
interfaces and routes (no second node here)."""
from __future__ import annotations

import socket

import pytest

from scalelab import gloo_net   # where gloo_interface and its helpers live (re-exported by scalelab.requeue)

UP, LOOP = 0x1, 0x8
LO = ("lo", "127.0.0.1", UP | LOOP)


def _host(monkeypatch, interfaces, routes: dict[str, str | None], names: dict[str, str]) -> None:
    """This 'node': its interfaces (name, IPv4, flags), the source address of its route to each
    destination (None: unreachable, e.g. no default route) and its name resolution."""
    monkeypatch.setattr(gloo_net, "_ipv4_interfaces", lambda: list(interfaces))
    monkeypatch.setattr(gloo_net, "_source_ip_to", lambda ip: routes.get(ip, routes.get("default")))

    def resolve(host):
        if host not in names:
            raise OSError(f"cannot resolve {host}")
        return names[host]

    monkeypatch.setattr(socket, "gethostbyname", resolve)


def _old_style_interface_to(monkeypatch, answer: str | None) -> None:
    """The same host as interface_to sees it, for code that asks only interface_to."""
    monkeypatch.setattr(gloo_net, "interface_to", lambda host: answer if host else None)


def test_torchrun_node_0_named_by_a_loopback_name_takes_the_default_route(monkeypatch):
    _host(monkeypatch, [LO, ("docker0", "172.17.0.1", UP), ("eth0", "10.1.2.3", UP)],
          {"127.0.1.1": "127.0.0.1", "default": "10.1.2.3"}, {"node0": "127.0.1.1"})
    _old_style_interface_to(monkeypatch, "lo")   # node0 -> 127.0.1.1 -> lo, as on this VM
    env = {"MASTER_ADDR": "node0", "MASTER_PORT": "29500"}   # torchrun: no SLURM_JOB_NODELIST
    line = gloo_net.gloo_interface(2, env)
    assert env["GLOO_SOCKET_IFNAME"] == "eth0"
    assert line.startswith("[scalelab] GLOO_SOCKET_IFNAME=eth0 (the default route's interface): "
                           "MASTER_ADDR=node0 "), line


def test_without_a_default_route_the_first_interface_up_and_not_a_bridge(monkeypatch):
    _host(monkeypatch, [LO, ("docker0", "172.17.0.1", UP), ("ib0", "192.168.7.1", 0),   # ib0 is down
                        ("ens5", "10.0.0.9", UP)],
          {"127.0.1.1": "127.0.0.1", "default": None}, {"node0": "127.0.1.1"})
    _old_style_interface_to(monkeypatch, "lo")
    env = {"MASTER_ADDR": "node0"}
    line = gloo_net.gloo_interface(2, env)
    assert env["GLOO_SOCKET_IFNAME"] == "ens5"
    assert "(the first interface that is up (no default route))" in line


def test_a_slurm_list_whose_every_node_is_loopback_here_falls_back_too(monkeypatch):
    _host(monkeypatch, [LO, ("eth1", "10.9.9.9", UP)], {"default": "10.9.9.9", "127.0.0.1": "127.0.0.1"},
          {"localhost": "127.0.0.1"})
    _old_style_interface_to(monkeypatch, "lo")
    env = {"MASTER_ADDR": "localhost", "SLURM_JOB_NODELIST": "localhost"}
    gloo_net.gloo_interface(2, env)
    assert env["GLOO_SOCKET_IFNAME"] == "eth1"


def test_a_node_with_only_loopback_is_left_alone_with_a_warning(monkeypatch):
    _host(monkeypatch, [LO], {"default": None, "127.0.1.1": "127.0.0.1"}, {"node0": "127.0.1.1"})
    _old_style_interface_to(monkeypatch, "lo")
    env = {"MASTER_ADDR": "node0"}
    line = gloo_net.gloo_interface(2, env)
    assert "GLOO_SOCKET_IFNAME" not in env
    assert line.startswith("[scalelab] warning: MASTER_ADDR=node0 routes via loopback"), line
    assert "set GLOO_SOCKET_IFNAME" in line


def test_a_routed_master_needs_no_fallback_and_no_line(monkeypatch):
    _host(monkeypatch, [LO, ("eth0", "10.1.2.3", UP), ("eth1", "10.2.0.4", UP)],
          {"10.2.0.1": "10.2.0.4", "default": "10.1.2.3"}, {"node0": "10.2.0.1"})
    _old_style_interface_to(monkeypatch, "eth1")
    env = {"MASTER_ADDR": "node0"}
    assert gloo_net.gloo_interface(2, env) is None
    assert env["GLOO_SOCKET_IFNAME"] == "eth1"   # the route to MASTER_ADDR, not the default one


@pytest.mark.parametrize("nodes,env", [(1, {"MASTER_ADDR": "node0"}),
                                       (2, {"MASTER_ADDR": "node0", "GLOO_SOCKET_IFNAME": "ib0"})])
def test_one_node_or_a_given_interface_is_left_alone(monkeypatch, nodes, env):
    _host(monkeypatch, [LO, ("eth0", "10.1.2.3", UP)], {"default": "10.1.2.3"}, {"node0": "127.0.1.1"})
    _old_style_interface_to(monkeypatch, "lo")
    before = dict(env)
    assert gloo_net.gloo_interface(nodes, env) is None
    assert env == before


def test_interface_to_reads_the_route_and_the_interfaces(monkeypatch):
    """The real interface_to over the fakes: the interface holding the route's source address."""
    _host(monkeypatch, [LO, ("eth0", "10.1.2.3", UP)], {"127.0.1.1": "127.0.0.1", "10.1.2.7": "10.1.2.3"},
          {"node0": "127.0.1.1", "node1": "10.1.2.7"})
    assert gloo_net.interface_to("node0") == "lo"
    assert gloo_net.interface_to("node1") == "eth0"
    assert gloo_net.interface_to("nowhere") is None


def test_an_ipv6_master_is_said_to_be_ipv6_not_unresolvable(monkeypatch):
    """launcher.rdzv_endpoint="[::1]:29632" completed, but its line said 'MASTER_ADDR=::1 does not
    resolve here': the interface choice reads IPv4 interfaces only."""
    _host(monkeypatch, [LO, ("eth0", "10.1.2.3", UP)], {"default": "10.1.2.3"}, {})
    env = {"MASTER_ADDR": "::1"}
    line = gloo_net.gloo_interface(2, env)
    assert line == ("[scalelab] GLOO_SOCKET_IFNAME=eth0 (the default route's interface): MASTER_ADDR=::1 is IPv6 "
                    "(the interface is chosen among IPv4 ones); set GLOO_SOCKET_IFNAME to choose another")

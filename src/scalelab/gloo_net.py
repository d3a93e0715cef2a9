"""Which network interface gloo binds on a multi-node job (GLOO_SOCKET_IFNAME): the one that routes
to MASTER_ADDR, else to another node of the job, else the default route's or the first one up.
Called by each rank (scalelab.worker) before Lightning makes any process group."""
from __future__ import annotations

import os

from scalelab.slurm_env import expand_nodelist

# An address outside every network a node is on (TEST-NET-2, RFC 5737): a UDP connect to it
# picks the default route's source address and sends nothing.
_OUTSIDE = "198.51.100.1"
_IFF_UP, _IFF_LOOPBACK = 0x1, 0x8


def _source_ip_to(ip: str) -> str | None:
    """This node's IPv4 address that the kernel's route to `ip` starts from (a UDP connect picks
    the route and sends nothing); None where there is no route (no default route)."""
    import socket

    try:
        with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
            s.connect((ip, 9))
            return s.getsockname()[0]
    except OSError:
        return None


def _ipv4_interfaces() -> list[tuple[str, str, int]]:
    """(name, IPv4 address, flags) of this node's interfaces that hold one (Linux: SIOCGIFADDR,
    SIOCGIFFLAGS), in the kernel's order."""
    import fcntl
    import socket
    import struct

    out = []
    try:
        with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
            for _, name in socket.if_nameindex():
                req = struct.pack("256s", name[:15].encode())
                try:
                    addr = socket.inet_ntoa(fcntl.ioctl(s.fileno(), 0x8915, req)[20:24])   # SIOCGIFADDR
                    flags = struct.unpack("H", fcntl.ioctl(s.fileno(), 0x8913, req)[16:18])[0]   # SIOCGIFFLAGS
                except OSError:   # no IPv4 address on it
                    continue
                out.append((name, addr, flags))
    except OSError:
        pass
    return out


def interface_to(host: str | None) -> str | None:
    """The name of this node's network interface whose address routes to `host` (MASTER_ADDR),
    IPv4; None if it does not resolve or no interface holds the address (Linux: SIOCGIFADDR)."""
    import socket

    try:
        ip = _source_ip_to(socket.gethostbyname(host or ""))
    except OSError:
        return None
    return next((name for name, addr, _ in _ipv4_interfaces() if addr == ip), None) if ip else None


def _loopback(name: str | None) -> bool:
    return name == "lo" or any(n == name and flags & _IFF_LOOPBACK for n, _, flags in _ipv4_interfaces())


# bridges and virtual links a container runtime or VM host adds: the last choice for a node's own
_VIRTUAL = ("docker", "veth", "virbr", "br-", "cni", "flannel", "cali", "vxlan", "tun", "tap")


def outward_interface() -> tuple[str | None, str]:
    """(interface, how it was chosen) for reaching other nodes when no node name routes off this
    one: the default route's interface, else the first interface that is up, not loopback and holds
    an IPv4 address (virtual bridges last); (None, why) where there is none."""
    ip = _source_ip_to(_OUTSIDE)
    found = _ipv4_interfaces()
    name = next((n for n, addr, flags in found if addr == ip and not flags & _IFF_LOOPBACK), None) if ip else None
    if name:
        return name, "the default route's interface"
    up = [n for n, addr, flags in found if flags & _IFF_UP and not flags & _IFF_LOOPBACK
          and not addr.startswith("127.")]
    up.sort(key=lambda n: n.startswith(_VIRTUAL))   # stable: the kernel's order otherwise
    if up:
        return up[0], "the first interface that is up (no default route)"
    return None, "this node has no interface up besides loopback"


def gloo_interface(num_nodes: int, environ=None) -> str | None:
    """GLOO_SOCKET_IFNAME, where unset on a multi-node job, = the interface that reaches MASTER_ADDR.
    Gloo (a CPU job's process group; scalelab.requeue's flag group on an NCCL job) binds to the address
    the hostname resolves to, and falls back to loopback where that is a loopback one
    (Debian/Ubuntu's `127.0.1.1 host` in /etc/hosts): the other nodes then cannot connect, and the
    job waits out the collective timeout at its start, though NCCL (which picks its interface
    itself) would have run. Called by each rank (worker.py) before Lightning makes any group.
    On MASTER_ADDR's own node, whose name may resolve to loopback there, the job's other nodes are
    asked instead; where none is known or every one routes via loopback (launcher=torchrun has
    no node list, and on node 0 MASTER_ADDR is node 0 itself), the default route's interface, else
    the first one up (outward_interface). Returns a line for the rank's log when it had to guess
    that way (None otherwise)."""
    env = os.environ if environ is None else environ
    if num_nodes <= 1 or env.get("GLOO_SOCKET_IFNAME"):
        return None
    nodes = expand_nodelist(env.get("SLURM_JOB_NODELIST") or env.get("SLURM_NODELIST") or "")
    found = {}
    for host in [env.get("MASTER_ADDR"), *nodes]:
        name = found[host] = interface_to(host) if host else None
        if name and not _loopback(name):
            env["GLOO_SOCKET_IFNAME"] = name
            return None
    name, how = outward_interface()
    addr = env.get("MASTER_ADDR")
    why = ("no MASTER_ADDR" if not addr
           else f"MASTER_ADDR={addr} is IPv6 (the interface is chosen among IPv4 ones)" if ":" in addr
           else f"MASTER_ADDR={addr} does not resolve here" if found.get(addr) is None
           else f"MASTER_ADDR={addr} routes via loopback on this node") + \
        (" (as does every node of SLURM_JOB_NODELIST)" if nodes else "")
    if name is None:
        return (f"[scalelab] warning: {why} and {how}: gloo binds loopback, which the job's other nodes cannot "
                "reach (set GLOO_SOCKET_IFNAME to the interface they can)")
    env["GLOO_SOCKET_IFNAME"] = name
    return f"[scalelab] GLOO_SOCKET_IFNAME={name} ({how}): {why}; set GLOO_SOCKET_IFNAME to choose another"

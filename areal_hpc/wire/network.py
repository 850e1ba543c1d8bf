"""Addresses where process groups meet: this node's address, the sockets' interface, a free port.

Every listener of the job (rank 0's lifelines, the trainer group's store, each weight group's
sender) publishes `node_address()` and binds exactly it; other nodes connect to it. The hostname
is not enough: Debian and Ubuntu map it to 127.0.1.1 in /etc/hosts (this sandbox to 127.0.0.1),
which no other node reaches. So the address is, in order:
1. the IPv4 address of `cluster.network_interface` when the config names one;
2. the source address of the route towards `toward` (rank 0's address, for every worker): a UDP
   socket "connected" there sends nothing, and the kernel picks the interface that reaches it;
3. the hostname's address, when it is no loopback address and belongs to an interface here;
4. the source address of the default route;
5. the first non-loopback IPv4 address of an interface that is up;
6. 127.0.0.1, only when the node has no other address (then the whole job is on this node).

gloo binds the interface GLOO_SOCKET_IFNAME names and otherwise the hostname's address (the same
127.0.1.1), and NCCL's bootstrap the one NCCL_SOCKET_IFNAME names: `socket_env` says what every
worker rank sets at start (runtime/world.py), before any process group exists.
"""

from __future__ import annotations

import ipaddress
import socket
from collections.abc import Mapping

from areal_hpc.errors import ConfigError

# A public address (TEST-NET-3, RFC 5737) reached by the default route: connecting a UDP socket there
# sends no packet but asks the kernel for the source address of that route.
_DEFAULT_ROUTE_PROBE = "203.0.113.1"
LOOPBACK = "127.0.0.1"


def ipv4_addresses() -> dict[str, str]:
    """Interface name -> its first IPv4 address, for every interface that is up."""
    import psutil

    up = {name for name, stats in psutil.net_if_stats().items() if stats.isup}
    out = {}
    for name, addrs in psutil.net_if_addrs().items():
        v4 = [a.address for a in addrs if a.family == socket.AF_INET]
        if name in up and v4:
            out[name] = v4[0]
    return out


def interface_address(interface: str) -> str:
    """The IPv4 address of a named interface; ConfigError naming the interfaces there are."""
    found = ipv4_addresses()
    if interface not in found:
        have = ", ".join(f"{n} ({a})" for n, a in sorted(found.items())) or "none"
        raise ConfigError(f"cluster.network_interface = {interface!r}: no such interface with an IPv4"
                          f" address is up on {socket.gethostname()}; up here: {have}")
    return found[interface]


def interface_of(address: str) -> str | None:
    """The interface that holds `address`, or None."""
    return next((n for n, a in ipv4_addresses().items() if a == address), None)


def route_source(peer: str) -> str | None:
    """The source address of this node's route towards `peer`, or None without a route."""
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
        try:
            s.connect((peer, 9))
            return s.getsockname()[0]
        except OSError:
            return None


def _hostname_address() -> str | None:
    try:
        return socket.gethostbyname(socket.gethostname())
    except OSError:
        return None


def is_loopback(address: str) -> bool:
    return ipaddress.ip_address(address).is_loopback


def choose_address(local: Mapping[str, str], towards_peer: str | None, hostname: str | None,
                   default_route: str | None) -> str:
    """Steps 2-6 of the module docstring, from what was observed: `local` (interface -> address),
    the route sources towards the peer and the default route, the hostname's address."""
    if towards_peer is not None:
        return towards_peer
    addresses = set(local.values())
    if hostname is not None and not is_loopback(hostname) and hostname in addresses:
        return hostname
    if default_route is not None and not is_loopback(default_route):
        return default_route
    return next((a for _, a in sorted(local.items()) if not is_loopback(a)), LOOPBACK)


def node_address(interface: str | None = None, toward: str | None = None) -> str:
    """This node's address for listeners that other nodes of the job connect to.

    `interface`: cluster.network_interface (None: automatic); `toward`: an address of the job to
    reach (rank 0's, for the workers), whose route decides the interface."""
    if interface is not None:
        return interface_address(interface)
    return choose_address(ipv4_addresses(), route_source(toward) if toward is not None else None,
                          _hostname_address(), route_source(_DEFAULT_ROUTE_PROBE))


def socket_env(interface: str | None, address: str, env: Mapping[str, str]) -> dict[str, str]:
    """The variables a worker rank sets so that gloo and NCCL use the interface of `address`.

    A configured interface sets GLOO_SOCKET_IFNAME and NCCL_SOCKET_IFNAME, over the environment's.
    Automatic: GLOO_SOCKET_IFNAME becomes the interface holding `address` unless the environment
    names one (gloo's own choice is the hostname's address); NCCL keeps its own detection, which
    skips loopback and docker interfaces and prefers InfiniBand.
    """
    if interface is not None:
        return {"GLOO_SOCKET_IFNAME": interface, "NCCL_SOCKET_IFNAME": interface}
    if "GLOO_SOCKET_IFNAME" in env:
        return {}
    name = interface_of(address)
    return {"GLOO_SOCKET_IFNAME": name} if name is not None else {}


def free_port() -> int:
    """A TCP port that was free a moment ago (the group's store binds it right after)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("", 0))
        return s.getsockname()[1]

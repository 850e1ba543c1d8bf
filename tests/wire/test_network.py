"""The address a rank publishes reaches rank 0's node, never loopback when another address exists;
tested with this machine's real interfaces (psutil) and real sockets."""

from __future__ import annotations

import os
import socket
import subprocess
import sys

import psutil
import pytest

from areal_hpc.errors import ConfigError
from areal_hpc.wire import network
from areal_hpc.wire.network import choose_address, free_port, node_address, socket_env


def up_ipv4() -> dict[str, str]:
    """This machine's interfaces that are up, with their first IPv4 address, read here directly."""
    stats = psutil.net_if_stats()
    return {name: v4[0] for name, addrs in psutil.net_if_addrs().items()
            if stats[name].isup and (v4 := [a.address for a in addrs if a.family == socket.AF_INET])}


def external() -> tuple[str, str] | None:
    """An interface of this machine that is up and not loopback, with its address."""
    return next(((n, a) for n, a in sorted(up_ipv4().items()) if not a.startswith("127.")), None)


def test_a_named_interface_gives_its_address() -> None:
    for name, address in up_ipv4().items():
        assert node_address(name) == address
    assert node_address("lo") == "127.0.0.1"


def test_a_missing_interface_is_named_with_those_there_are() -> None:
    with pytest.raises(ConfigError) as info:
        node_address("no-such-if0")
    message = str(info.value)
    assert "cluster.network_interface = 'no-such-if0'" in message
    assert all(f"{n} ({a})" in message for n, a in up_ipv4().items())


def test_automatic_address_is_an_address_of_this_node_and_not_loopback() -> None:
    chosen = node_address()
    assert chosen in up_ipv4().values()
    if external() is not None:
        assert not chosen.startswith("127."), f"{chosen}: loopback although this node has {external()}"
    # This machine's hostname resolves to loopback (as Debian's 127.0.1.1 does): not used.
    hostname = socket.gethostbyname(socket.gethostname())
    if hostname.startswith("127.") and external() is not None:
        assert chosen != hostname


def test_towards_a_peer_the_route_decides() -> None:
    assert node_address(toward="127.0.0.1") == "127.0.0.1"  # rank 0 on this node, by loopback
    ext = external()
    if ext is not None:
        assert node_address(toward=ext[1]) == ext[1]
    # A named interface wins over the route.
    assert node_address("lo", toward=ext[1] if ext else "127.0.0.1") == "127.0.0.1"


def test_choice_rules() -> None:
    local = {"lo": "127.0.0.1", "eth0": "10.0.0.5", "ib0": "10.1.0.5"}
    # The route towards rank 0 first.
    assert choose_address(local, "10.1.0.5", "10.0.0.5", "10.0.0.5") == "10.1.0.5"
    # Then the hostname's address, if it is one of this node's and no loopback.
    assert choose_address(local, None, "10.1.0.5", "10.0.0.5") == "10.1.0.5"
    assert choose_address(local, None, "127.0.1.1", "10.0.0.5") == "10.0.0.5"  # Debian's hosts line
    assert choose_address(local, None, "192.168.9.9", "10.0.0.5") == "10.0.0.5"  # of another machine
    # No default route: the first non-loopback interface; only loopback: loopback.
    assert choose_address(local, None, None, None) == "10.0.0.5"
    assert choose_address({"lo": "127.0.0.1"}, None, "127.0.1.1", None) == "127.0.0.1"


def test_socket_environment() -> None:
    assert socket_env("ib0", "10.1.0.5", {"NCCL_SOCKET_IFNAME": "eth0"}) == {
        "GLOO_SOCKET_IFNAME": "ib0", "NCCL_SOCKET_IFNAME": "ib0"}
    name, address = next(iter(sorted(up_ipv4().items())))
    assert socket_env(None, address, {}) == {"GLOO_SOCKET_IFNAME": name}
    assert socket_env(None, address, {"GLOO_SOCKET_IFNAME": "site0"}) == {}  # the site's choice stays
    assert socket_env(None, "203.0.113.7", {}) == {}  # no interface here holds it


GLOO_MEMBER = """
import datetime, sys, torch, torch.distributed as dist
rank, host, port = int(sys.argv[1]), sys.argv[2], int(sys.argv[3])
dist.init_process_group("gloo", init_method=f"tcp://{host}:{port}", rank=rank, world_size=2,
                        timeout=datetime.timedelta(seconds=60))
t = torch.tensor([rank + 1])
dist.all_reduce(t)
print(int(t), flush=True)
dist.barrier()  # neither rank leaves while the other still talks to rank 0's store
dist.destroy_process_group()
"""


def test_gloo_meets_on_the_chosen_interface() -> None:
    """Two real gloo ranks with the environment every worker sets (socket_env) meet at
    node_address() and all-reduce: gloo binds the interface named, not the hostname's address."""
    host, port = node_address(), free_port()
    env = {**os.environ, **socket_env(None, host, {}), "OMP_NUM_THREADS": "1"}
    assert env["GLOO_SOCKET_IFNAME"] == network.interface_of(host)
    members = [subprocess.Popen([sys.executable, "-c", GLOO_MEMBER, str(r), host, str(port)], env=env,
                                stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True) for r in (0, 1)]
    outs = [m.communicate(timeout=120) for m in members]
    assert [m.returncode for m in members] == [0, 0], [err[-2000:] for _, err in outs]
    assert [out.split() for out, _ in outs] == [["3"], ["3"]]

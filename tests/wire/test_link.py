"""A replacement generator's link to rank 0: greeted on the lifeline port with the job's secret,
messages whole both ways at a paper-scale trajectory's size, a dead peer noticed, a stranger never
taken; rank 0's hub puts MPI and links behind one poll (real sockets, real mpiexec)."""

from __future__ import annotations

import socket
import time

import numpy as np
from mpi_jobs import run_script

from areal_hpc.wire.lifeline import JOIN, LifelineServer, greeting
from areal_hpc.wire.link import Link, LinkChannel
from areal_hpc.wire.messages import Shutdown, Trajectory


def joined(server: LifelineServer, seconds: float = 5.0) -> list[socket.socket]:
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        server.ended()
        if got := server.joins():
            return got
        time.sleep(0.01)
    return []


def long_trajectory(n: int = 27_648) -> Trajectory:
    ids = np.arange(n, dtype=np.int32)
    return Trajectory(7, 3, [1, 2, 3], ids, -ids / n, ids * 0 + 5, "length", reward=1.0)


def test_a_replacement_greets_on_the_lifeline_port_and_messages_arrive_whole():
    server = LifelineServer([1, 2])
    try:
        chan = LinkChannel.connect(server.address, server.secret)
        (sock,) = joined(server)
        assert server.held == frozenset()  # a join connection is not a lifeline
        rank0 = Link(sock)
        traj = long_trajectory()
        chan.send(0, traj)
        rank0.send(Shutdown("done"))
        got: list[object] = []
        deadline = time.monotonic() + 10
        while not got and time.monotonic() < deadline:
            got += rank0.receive()
        assert got == [traj] and got[0].output_ids.dtype == np.int32
        assert chan.recv(0, timeout=10) == (0, Shutdown("done")) and chan.shutdown_seen
        assert chan.flush()
        chan.link.close()
        deadline = time.monotonic() + 5
        while not rank0.closed and time.monotonic() < deadline:
            rank0.receive()
        assert rank0.closed  # the replacement's process is gone: rank 0 sees it at once
    finally:
        server.close()


def test_a_join_without_the_jobs_secret_is_dropped():
    server = LifelineServer([1])
    try:
        stranger = socket.create_connection(server.address)
        stranger.sendall(greeting("00" * 16, JOIN))
        assert joined(server, seconds=1.0) == []
        stranger.settimeout(5)
        assert stranger.recv(1) == b""  # closed by rank 0
    finally:
        server.close()


def test_rank_0_is_gone_before_an_offer_came():
    server = LifelineServer([1])
    chan = LinkChannel.connect(server.address, server.secret)
    (sock,) = joined(server)
    sock.close()
    server.close()
    try:
        chan.recv(0, timeout=5)
    except ConnectionError as e:
        assert "rank 0 closed the connection" in str(e)
    else:
        raise AssertionError("no error")


HUB = (
    "import socket\n"
    "from mpi4py import MPI\n"
    "from areal_hpc.wire.link import Hub, Link\n"
    "from areal_hpc.wire.transport import Channel\n"
    "chan = Channel(MPI.COMM_WORLD)\n"
    "if chan.rank == 1:\n"
    "    chan.send(0, 'from the dead rank 1')\n"
    "    chan.send(0, 'sync')\n"
    "    chan.flush()\n"
    "    MPI.COMM_WORLD.Barrier()\n"
    "else:\n"
    "    hub = Hub(chan)\n"
    "    assert chan.recv(1, timeout=30) == (1, 'from the dead rank 1')\n"
    "    ours, theirs = socket.socketpair()\n"
    "    hub.attach(1, Link(ours))\n"
    "    replacement = Link(theirs)\n"
    "    replacement.send('from the replacement')\n"
    "    hub.send(1, 'to the replacement')\n"
    "    got = hub.recv(timeout=30)\n"
    "    assert got == (1, 'from the replacement'), got\n"  # MPI's 'sync' from rank 1 was dropped
    "    assert hub.poll() is None\n"
    "    import time\n"
    "    deadline = time.monotonic() + 10\n"
    "    seen = []\n"
    "    while not seen and time.monotonic() < deadline:\n"
    "        seen = replacement.receive()\n"
    "    assert seen == ['to the replacement'], seen\n"
    "    replacement.close()\n"
    "    deadline = time.monotonic() + 10\n"
    "    while not (gone := hub.closed()) and time.monotonic() < deadline:\n"
    "        hub.poll()\n"
    "    assert gone == [1] and hub.links == {}, gone\n"
    "    MPI.COMM_WORLD.Barrier()\n"
    "    print('rank 0 ok', flush=True)\n"
)


def test_the_hub_serves_mpi_and_links_alike_and_drops_a_replaced_ranks_mpi_messages():
    proc = run_script(2, HUB)
    assert proc.returncode == 0 and "rank 0 ok" in proc.stdout, proc.stdout + proc.stderr

"""Lifelines between rank 0 and the workers, with real processes and sockets (no MPI needed)."""

from __future__ import annotations

import resource
import signal
import socket
import subprocess
import sys
import time

import pytest

from areal_hpc.wire import lifeline
from areal_hpc.wire.lifeline import LifelineServer, greeting

RANKS = range(1, 8)


def worker(server: LifelineServer, rank: int, expected_end: bool = False) -> subprocess.Popen:
    """A process that holds its lifeline to `server` as worker `rank`, then waits (as a hung one)."""
    code = (
        "import sys, time\n"
        "from areal_hpc.wire.lifeline import hold\n"
        f"hold({server.address!r}, {server.secret!r}, {rank}, lambda: {expected_end})\n"
        "print('held', flush=True)\n"
        "time.sleep(120)\n"
    )
    proc = subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    assert proc.stdout.readline().strip() == "held"
    return proc


def poll_until(server: LifelineServer, done, seconds: float) -> list[int]:
    """Call ended() until done() holds; returns every rank reported meanwhile."""
    gone: list[int] = []
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        gone += server.ended()
        if done():
            return gone
        time.sleep(0.01)
    raise AssertionError(f"not done within {seconds} s (held {sorted(server.held)}, waiting {server.waiting})")


def ended_within(server: LifelineServer, seconds: float) -> list[int]:
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        if gone := server.ended():
            return gone
        time.sleep(0.01)
    return []


def test_a_killed_worker_is_reported_by_rank():
    server = LifelineServer(RANKS)
    alive, killed = worker(server, 3), worker(server, 5)
    try:
        poll_until(server, lambda: server.held == {3, 5}, 5)
        killed.send_signal(signal.SIGKILL)
        assert ended_within(server, 5) == [5]
        assert server.ended() == []  # reported once; rank 3 still alive
    finally:
        for p in (alive, killed):
            p.kill()
            p.wait()
        server.close()


def test_a_worker_leaves_when_rank_0_is_gone():
    server = LifelineServer(RANKS)
    proc = worker(server, 2)
    poll_until(server, lambda: server.held == {2}, 5)
    server.close()
    assert proc.wait(timeout=10) == 1
    assert "rank 2: rank 0 (controller) is gone" in proc.stderr.read()


def test_a_cut_worker_leaves_though_its_main_thread_hangs():
    server = LifelineServer(RANKS)
    # Even a worker whose end is expected (rank 0's Shutdown came) leaves when it is cut.
    hung, other = worker(server, 4, expected_end=True), worker(server, 6)
    try:
        poll_until(server, lambda: server.held == {4, 6}, 5)
        server.cut(4)
        assert hung.wait(timeout=10) == 1
        assert "rank 4: rank 0 dropped this rank from the run (it hung" in hung.stderr.read()
        assert ended_within(server, 5) == [4] and server.held == {6}
        assert other.poll() is None
        server.cut(4)  # already gone: nothing happens
    finally:
        for p in (hung, other):
            p.kill()
            p.wait()
        server.close()


def connect(server: LifelineServer, data: bytes = b"") -> socket.socket:
    s = socket.create_connection(server.address, timeout=5)
    if data:
        s.sendall(data)
    return s


def test_strangers_never_count_and_the_job_goes_on():
    """Connections without the job's secret, or claiming a rank that is not a worker of this job
    or already held, are dropped; hanging up afterwards names nobody."""
    server = LifelineServer(RANKS)
    own = connect(server, greeting(server.secret, 4))
    poll_until(server, lambda: server.held == {4}, 5)
    other_job = lifeline.new_secret()
    strangers = [
        connect(server, (4).to_bytes(4, "big")),  # the old protocol's 4 bytes: a rank, no secret
        connect(server, greeting(other_job, 3)),  # another job's secret
        connect(server, greeting(server.secret, 99)),  # not a rank of this job
        connect(server, greeting(server.secret, 0)),  # rank 0 has no lifeline
        connect(server, greeting(server.secret, 4)),  # rank 4 is already held
        connect(server, greeting(server.secret, 2)[:10]),  # half a greeting, then gone
    ]
    try:
        poll_until(server, lambda: server.waiting == 2, 5)  # the two short greetings still wait
        for s in strangers:
            s.close()
        assert poll_until(server, lambda: server.waiting == 0, 5) == []
        time.sleep(0.1)
        assert server.ended() == [] and server.held == {4}
        own.close()
        assert ended_within(server, 5) == [4]
    finally:
        own.close()
        server.close()


def test_silent_connections_are_dropped_after_the_hello_timeout(monkeypatch):
    monkeypatch.setattr(lifeline, "HELLO_TIMEOUT_S", 0.5)
    server = LifelineServer(RANKS)
    silent = [connect(server) for _ in range(20)]
    try:
        poll_until(server, lambda: server.waiting == 20, 5)
        start = time.monotonic()
        assert poll_until(server, lambda: server.waiting == 0, 5) == []
        assert time.monotonic() - start >= 0.3
        assert all(s.recv(1) == b"" for s in silent)  # rank 0 closed them
    finally:
        for s in silent:
            s.close()
        server.close()


def test_a_greeting_trickled_in_is_dropped_when_its_time_since_connecting_is_up(monkeypatch):
    """A slow client sending a right greeting a byte at a time cannot hold a socket past
    HELLO_TIMEOUT_S: the time counts from the connection, not from its last byte."""
    monkeypatch.setattr(lifeline, "HELLO_TIMEOUT_S", 0.5)
    server = LifelineServer(RANKS)
    slow = connect(server)
    try:
        start = time.monotonic()
        for byte in greeting(server.secret, 3)[:-1]:
            server.ended()
            try:
                slow.send(bytes([byte]))
            except OSError:  # rank 0 closed it
                break
            time.sleep(0.1)
        poll_until(server, lambda: server.waiting == 0, 5)
        assert time.monotonic() - start < 1.5 and server.held == frozenset()
        assert closed_by_peer(slow)
    finally:
        slow.close()
        server.close()


def test_a_greeting_replayed_after_its_ranks_line_ended_is_dropped_until_a_replacement_is_expected():
    """A recorded greeting sent again once its rank is gone names nobody, so the rank stays vacant
    for a replacement and is not reported lost twice; once rank 0 offered the rank to a
    replacement (`expect`), one greeting names it again, and only one."""
    server = LifelineServer(RANKS)
    own = connect(server, greeting(server.secret, 5))
    poll_until(server, lambda: server.held == {5}, 5)
    own.close()
    assert ended_within(server, 5) == [5]
    replay = connect(server, greeting(server.secret, 5))
    lines = [replay]
    try:
        poll_until(server, lambda: closed_by_peer(replay), 5)
        assert server.held == frozenset() and server.waiting == 0 and server.ended() == []
        server.expect(5)
        lines.append(connect(server, greeting(server.secret, 5)))
        poll_until(server, lambda: server.held == {5}, 5)
        lines.append(connect(server, greeting(server.secret, 5)))
        poll_until(server, lambda: closed_by_peer(lines[-1]), 5)
        assert server.held == {5} and not closed_by_peer(lines[1])
        with pytest.raises(ValueError, match="rank 99 is not a worker rank"):
            server.expect(99)
    finally:
        for line in lines:
            line.close()
        server.close()


def test_a_flood_of_waiting_connections_is_capped(monkeypatch):
    """Beyond MAX_UNNAMED connections waiting for their greeting, the oldest are closed, and a
    worker arriving after the flood still gets its lifeline."""
    monkeypatch.setattr(lifeline, "MAX_UNNAMED", 16)
    server = LifelineServer(RANKS)
    flood = [connect(server) for _ in range(40)]
    try:
        poll_until(server, lambda: server.waiting == 16 and sum(map(closed_by_peer, flood)) == 24, 5)
        assert not any(map(closed_by_peer, flood[-16:]))  # the newest 16 wait
        own = connect(server, greeting(server.secret, 1))
        poll_until(server, lambda: server.held == {1}, 5)
        own.close()
        assert ended_within(server, 5) == [1]
    finally:
        for s in flood:
            s.close()
        server.close()


def closed_by_peer(s: socket.socket) -> bool:
    s.setblocking(False)
    try:
        return s.recv(1) == b""
    except BlockingIOError:
        return False
    except ConnectionResetError:  # closed with bytes of ours unread
        return True


CONCURRENT = 4096


def test_4096_concurrent_lifelines():
    """A job's worth of lifelines on one rank 0 (select() could not watch descriptors past 1024):
    all are named, and the one that ends is the one reported."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    need = 2 * CONCURRENT + 256  # both ends live in this process
    if hard != resource.RLIM_INFINITY and hard < need:
        pytest.skip(f"the descriptor limit ({hard}) is below the {need} this test needs")
    if soft != resource.RLIM_INFINITY and soft < need:
        resource.setrlimit(resource.RLIMIT_NOFILE, (need, hard))
    ranks = range(1, CONCURRENT + 1)
    server = LifelineServer(ranks)
    lines: dict[int, socket.socket] = {}
    try:
        for rank in ranks:
            lines[rank] = connect(server, greeting(server.secret, rank))
            if rank % 64 == 0:
                server.ended()  # rank 0 polls while the workers connect, as in a real start
        poll_until(server, lambda: len(server.held) == CONCURRENT, 30)
        assert server.waiting == 0
        lines.pop(2345).close()
        assert ended_within(server, 5) == [2345]
        assert server.ended() == [] and len(server.held) == CONCURRENT - 1
    finally:
        for s in lines.values():
            s.close()
        server.close()
        resource.setrlimit(resource.RLIMIT_NOFILE, (soft, hard))

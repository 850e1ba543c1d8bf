"""Lifelines between rank 0 and the workers, with real processes and sockets (no MPI needed)."""

from __future__ import annotations

import signal
import subprocess
import sys
import time

from areal_hpc.runtime.lifeline import LifelineServer


def worker(server: LifelineServer, rank: int) -> subprocess.Popen:
    """A process that holds its lifeline to `server` as worker `rank`, then waits."""
    code = (
        "import sys, time\n"
        "from areal_hpc.runtime.lifeline import hold\n"
        f"hold({server.address!r}, {rank}, lambda: False)\n"
        "print('held', flush=True)\n"
        "time.sleep(120)\n"
    )
    proc = subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    assert proc.stdout.readline().strip() == "held"
    return proc


def ended_within(server: LifelineServer, seconds: float) -> list[int]:
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        if gone := server.ended():
            return gone
        time.sleep(0.01)
    return []


def test_a_killed_worker_is_reported_by_rank():
    server = LifelineServer()
    alive, killed = worker(server, 3), worker(server, 5)
    try:
        assert server.ended() == []  # both connected, both alive
        killed.send_signal(signal.SIGKILL)
        assert ended_within(server, 5) == [5]
        assert server.ended() == []  # reported once; rank 3 still alive
    finally:
        for p in (alive, killed):
            p.kill()
            p.wait()
        server.close()


def test_a_worker_leaves_when_rank_0_is_gone():
    server = LifelineServer()
    proc = worker(server, 2)
    server.ended()  # accept the line
    server.close()
    assert proc.wait(timeout=10) == 1
    assert "rank 2: rank 0 (controller) is gone" in proc.stderr.read()

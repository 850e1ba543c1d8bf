"""Lifelines: one TCP connection from every worker rank to rank 0, so that a rank that dies is named.

A rank killed outright (kill -9, the out-of-memory killer, a lost node) sends no message. mpiexec
kills the other ranks at once and names the process itself; srun --kill-on-bad-exit sends them
SIGTERM and only KillWait seconds later SIGKILL, and where a launcher leaves them running, MPI
would only notice on the next message to the dead rank, if ever. The operating system closes a
dead process's sockets at once, so rank 0 sees its lifeline end within milliseconds, names the
rank and role, and aborts the job. The worker watches the same connection from its side: when
rank 0 is gone without a Shutdown, it leaves instead of waiting forever. (Spawned children such as
vLLM's engine core do not inherit the socket: it is close-on-exec.)
"""

from __future__ import annotations

import os
import select
import socket
import struct
import sys
import threading
import time
from collections.abc import Callable

from areal_hpc.runtime.network import node_address

# Seconds a worker keeps trying to reach rank 0's lifeline listener.
CONNECT_TIMEOUT_S = 60.0
_RANK = struct.Struct("!i")


class LifelineServer:
    """Rank 0's end: accepts one lifeline per worker rank and reports the ranks whose line ended.
    Never blocks: a line is known by its rank once its four bytes have arrived."""

    def __init__(self) -> None:
        self._listener = socket.create_server(("", 0))
        self._listener.setblocking(False)
        self.address = (node_address(), self._listener.getsockname()[1])
        self._lines: dict[socket.socket, int] = {}
        self._unnamed: dict[socket.socket, bytes] = {}  # accepted, rank not yet (fully) received

    def ended(self) -> list[int]:
        """Ranks whose lifeline closed since the last call (their process is gone)."""
        self._accept()
        watched = [*self._lines, *self._unnamed]
        if not watched:
            return []
        readable, _, _ = select.select(watched, [], [], 0)
        gone = []
        for line in readable:
            try:
                data = line.recv(_RANK.size if line in self._unnamed else 1)
            except OSError:
                data = b""
            if line in self._unnamed:
                if not data:  # closed before saying who it was: not a worker's lifeline
                    del self._unnamed[line]
                    line.close()
                    continue
                got = self._unnamed.pop(line) + data
                if len(got) < _RANK.size:
                    self._unnamed[line] = got
                else:
                    (self._lines[line],) = _RANK.unpack(got[: _RANK.size])
            elif not data:
                gone.append(self._lines.pop(line))
                line.close()
        return sorted(gone)

    def _accept(self) -> None:
        while True:
            try:
                line, _ = self._listener.accept()
            except BlockingIOError:
                return
            line.setblocking(False)
            self._unnamed[line] = b""

    def close(self) -> None:
        for line in [*self._lines, *self._unnamed]:
            line.close()
        self._lines.clear()
        self._unnamed.clear()
        self._listener.close()


def hold(address: tuple[str, int], rank: int, expected_end: Callable[[], bool]) -> socket.socket:
    """A worker's end: connect to rank 0 and watch the line in a daemon thread. If rank 0 goes away
    while `expected_end()` is false, print why and leave at once with exit code 1."""
    deadline = time.monotonic() + CONNECT_TIMEOUT_S
    while True:
        try:
            line = socket.create_connection(address, timeout=5)
            break
        except OSError:
            if time.monotonic() > deadline:
                raise
            time.sleep(0.5)
    line.sendall(_RANK.pack(rank))
    line.settimeout(None)

    def watch() -> None:
        try:
            while line.recv(1):
                pass
        except OSError:
            pass
        if not expected_end():
            print(f"rank {rank}: rank 0 (controller) is gone; leaving", file=sys.stderr, flush=True)
            os._exit(1)

    threading.Thread(target=watch, name="lifeline", daemon=True).start()
    return line

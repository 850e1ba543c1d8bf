"""Lifelines: one TCP connection from every worker rank to rank 0, so that a rank that dies is named.

A rank killed outright (kill -9, the out-of-memory killer, a lost node) sends no message. Plain
mpiexec kills the other ranks at once and names the process itself; where the launcher leaves them
running (srun --kill-on-bad-exit=0, mpiexec -disable-auto-cleanup), MPI would only notice on the
next message to the dead rank, if ever. The operating system closes a dead process's sockets at
once, so rank 0 sees its lifeline end within milliseconds and names the rank and role: it goes on
without a lost generator and aborts the job for any other rank. The worker watches the same
connection from its side: when rank 0 is gone without a Shutdown, it leaves instead of waiting
forever. The line also carries rank 0's one word to a worker whose main thread hangs: CUT (rank 0
dropped the rank from the run: it hung or failed), on which the watching thread ends the process, so the hung rank
goes the way a dead one does. (Spawned children such as vLLM's engine core do not inherit the
socket: it is close-on-exec.)

A line counts only once it has said who it is: the job's secret (made by rank 0, sent to the
workers in the launch plan) and a rank of this job that rank 0 expects: every worker rank once
at launch, and a lost rank once more when it is offered to a replacement (`expect`). Anything else
on the port (a port scanner, another job, a stranger, a greeting replayed after its rank's line
ended, which would otherwise keep that rank from being replaced) is dropped without effect: a wrong greeting at once, a silent
or slow one HELLO_TIMEOUT_S after it connected, however it trickles in, and at most MAX_UNNAMED are
kept waiting, so a flood cannot use up rank 0's descriptors. The secret keeps out whoever cannot
read the job's launch plan or join file; like MPI's and NCCL's own traffic, the line is not
encrypted, so the job's network is trusted not to be read by others. A spare generator greets with the rank JOIN instead: its
connection is handed over (`joins`) to become its message link (wire/link.py). The server polls with the platform's selector (epoll on
Linux), whose cost per call is the number of lines that changed, not the number held (select()
also fails once a descriptor number passes 1024; a 513-rank job on one node's rank 0 gets there).
"""

from __future__ import annotations

import hmac
import os
import secrets
import selectors
import socket
import struct
import sys
import threading
import time
from collections.abc import Callable, Collection

from areal_hpc.wire.network import node_address

# Seconds a worker keeps trying to reach rank 0's lifeline listener.
CONNECT_TIMEOUT_S = 60.0
# Seconds a new connection has to send its whole greeting before it is dropped.
HELLO_TIMEOUT_S = 10.0
# Connections kept waiting for their greeting at once; the oldest is dropped beyond this.
MAX_UNNAMED = 8192
# Connections the kernel queues before rank 0 accepts them (capped by net.core.somaxconn): every
# worker of a 513-rank job connects within the same few milliseconds.
BACKLOG = 4096
SECRET_BYTES = 16
# The one byte rank 0 sends on a line: this rank is dropped from the run (it hung); leave.
CUT = b"C"
# The rank a replacement generator greets with on the connection that becomes its message link
# (wire/link.py): it has no rank until rank 0 offers it a lost generator's.
JOIN = -1
_RANK = struct.Struct("!i")
GREETING_BYTES = SECRET_BYTES + _RANK.size


def new_secret() -> str:
    """The job's lifeline secret (hex), made by rank 0 and sent in the launch plan."""
    return secrets.token_hex(SECRET_BYTES)


def greeting(secret: str, rank: int) -> bytes:
    """What a worker sends first on its line: the job's secret, then its rank."""
    return bytes.fromhex(secret) + _RANK.pack(rank)


class LifelineServer:
    """Rank 0's end: accepts one lifeline per worker rank and reports the ranks whose line ended.
    Never blocks. `ranks` are the worker ranks of this job (a line claiming another is dropped);
    it listens on this node's address (wire/network.py; `interface`: cluster.network_interface)."""

    def __init__(self, ranks: Collection[int], secret: str | None = None, interface: str | None = None) -> None:
        self.secret = secret or new_secret()
        self._key = bytes.fromhex(self.secret)
        self._ranks = frozenset(ranks)
        address = node_address(interface)
        try:
            self._listener = socket.create_server((address, 0), backlog=BACKLOG)
        except OSError:  # the name resolves to an address of no interface here: every address
            self._listener = socket.create_server(("", 0), backlog=BACKLOG)
        self._listener.setblocking(False)
        self.address = (address, self._listener.getsockname()[1])
        self._selector = selectors.DefaultSelector()
        self._selector.register(self._listener, selectors.EVENT_READ)
        self._lines: dict[socket.socket, int] = {}  # named line -> its rank
        self._joins: list[socket.socket] = []  # greeted as JOIN, not yet taken
        self._held: set[int] = set()
        self._expected: set[int] = set(self._ranks)  # ranks whose next greeting names them
        # Accepted, greeting not yet (fully) received: line -> (bytes so far, accepted at).
        self._unnamed: dict[socket.socket, tuple[bytes, float]] = {}

    @property
    def held(self) -> frozenset[int]:
        """Ranks whose lifeline is connected and named."""
        return frozenset(self._held)

    @property
    def waiting(self) -> int:
        """Connections accepted that have not (yet) said who they are."""
        return len(self._unnamed)

    def ended(self) -> list[int]:
        """Ranks whose lifeline closed since the last call (their process is gone)."""
        gone = []
        for key, _ in self._selector.select(timeout=0):
            line = key.fileobj
            if line is self._listener:
                self._accept()
            elif line in self._unnamed:
                self._hear(line)
            elif line in self._lines and self._closed(line):
                rank = self._lines.pop(line)
                self._held.discard(rank)
                self._drop(line)
                gone.append(rank)
        self._reap(time.monotonic())
        return sorted(gone)

    def _accept(self) -> None:
        while True:
            try:
                line, _ = self._listener.accept()
            except (BlockingIOError, InterruptedError):
                return
            except OSError:  # out of descriptors: what waits longest makes room
                self._reap(time.monotonic(), room=1)
                return
            line.setblocking(False)
            if len(self._unnamed) >= MAX_UNNAMED:
                self._drop(next(iter(self._unnamed)))
            self._unnamed[line] = (b"", time.monotonic())
            self._selector.register(line, selectors.EVENT_READ)

    def _hear(self, line: socket.socket) -> None:
        """More of a greeting: name the line when it is whole and right, else drop it."""
        got, since = self._unnamed[line]
        try:
            data = line.recv(GREETING_BYTES - len(got))
        except OSError:
            data = b""
        if not data:  # closed before saying who it was: not a worker's lifeline
            self._drop(line)
            return
        got += data
        if len(got) < GREETING_BYTES:
            self._unnamed[line] = (got, since)
            return
        (rank,) = _RANK.unpack(got[SECRET_BYTES:])
        if not hmac.compare_digest(got[:SECRET_BYTES], self._key):
            self._drop(line)
            return
        if rank == JOIN:
            del self._unnamed[line]
            self._selector.unregister(line)
            self._joins.append(line)
            return
        if rank not in self._expected:
            self._drop(line)
            return
        del self._unnamed[line]
        self._lines[line] = rank
        self._held.add(rank)
        self._expected.discard(rank)

    @staticmethod
    def _closed(line: socket.socket) -> bool:
        """A named line is readable: its end closed (a worker sends nothing after its greeting)."""
        try:
            return not line.recv(64)
        except (BlockingIOError, InterruptedError):
            return False
        except OSError:
            return True

    def _reap(self, now: float, room: int = 0) -> None:
        """Drop connections silent past HELLO_TIMEOUT_S, and the `room` oldest waiting ones."""
        for i, (line, (_, since)) in enumerate(list(self._unnamed.items())):
            if i >= room and now - since < HELLO_TIMEOUT_S:
                break  # insertion order is acceptance order: the rest are younger
            self._drop(line)

    def _drop(self, line: socket.socket) -> None:
        self._unnamed.pop(line, None)
        self._selector.unregister(line)
        line.close()

    def joins(self) -> list[socket.socket]:
        """Connections that greeted with the job's secret as JOIN since the last call: replacement
        generators, each line now theirs to use as a message link (non-blocking)."""
        taken, self._joins = self._joins, []
        return taken

    def expect(self, rank: int) -> None:
        """Let one more greeting name `rank`: a replacement offered that lost rank holds its lifeline."""
        if rank not in self._ranks:
            raise ValueError(f"rank {rank} is not a worker rank of this job")
        self._expected.add(rank)

    def cut(self, rank: int) -> None:
        """Tell worker `rank` it is dropped from the run, so its process leaves; `ended` reports
        it once it is gone, as any other. A line already gone is left to `ended`."""
        line = next((line for line, r in self._lines.items() if r == rank), None)
        if line is None:
            return
        try:
            line.send(CUT)  # one byte into a send buffer nothing else uses: does not block
        except OSError:
            pass

    def close(self) -> None:
        for line in [*self._lines, *self._unnamed]:
            self._selector.unregister(line)
            line.close()
        for line in self._joins:
            line.close()
        self._joins.clear()
        self._lines.clear()
        self._unnamed.clear()
        self._held.clear()
        self._selector.close()
        self._listener.close()


def connect(address: tuple[str, int], secret: str, rank: int) -> socket.socket:
    """A connection to rank 0's lifeline port that has greeted as `rank` (JOIN: a spare), trying
    for CONNECT_TIMEOUT_S while rank 0 is not listening yet."""
    deadline = time.monotonic() + CONNECT_TIMEOUT_S
    while True:
        try:
            line = socket.create_connection(address, timeout=5)
            break
        except OSError:
            if time.monotonic() > deadline:
                raise
            time.sleep(0.5)
    line.sendall(greeting(secret, rank))
    return line


def hold(address: tuple[str, int], secret: str, rank: int, expected_end: Callable[[], bool]) -> socket.socket:
    """A worker's end: connect to rank 0, say who it is, and watch the line in a daemon thread. If
    rank 0 goes away while `expected_end()` is false, or cuts the line (CUT), print why and leave at
    once with exit code 1, whatever the main thread is doing."""
    line = connect(address, secret, rank)
    line.settimeout(None)

    def watch() -> None:
        got = b""
        try:
            while (got := line.recv(1)) and got != CUT:
                pass
        except OSError:
            pass
        if got == CUT:
            print(f"rank {rank}: rank 0 dropped this rank from the run (it hung past its watchdog deadline"
                  " or failed); leaving", file=sys.stderr, flush=True)
            os._exit(1)
        if not expected_end():
            print(f"rank {rank}: rank 0 (controller) is gone; leaving", file=sys.stderr, flush=True)
            os._exit(1)

    threading.Thread(target=watch, name="lifeline", daemon=True).start()
    return line

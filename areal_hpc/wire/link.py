"""Messages to and from a replacement generator, which is not in the MPI world.

MPI's world is fixed at launch; a generator started later to replace a lost one (a new SLURM step
in the same allocation, `python -m areal_hpc.launch --join RUN_DIR`) reaches rank 0 over TCP
instead: it connects to rank 0's lifeline port and greets with the job's secret and the rank JOIN
(wire/lifeline.py), and that connection becomes its `Link`. Rank 0 offers it a lost generator's
rank (JoinOffer); from then on it is that generator, with its own lifeline, and the same messages
as any generator flow over the link: rank 0's `Hub` sends to and polls from the MPI channel and the
links alike, so the controller does not know which transport a rank uses.

MPI's dynamic process management (MPI_Comm_accept / MPI_Comm_connect) would keep one transport,
but rank 0 would wait in MPI_Comm_accept with no deadline, and a replacement that died in the
handshake would hang the controller; a socket's accept and reads never block here.

A frame is an 8-byte length and a pickle (protocol 5) of one message, read only from a peer that
presented the job's secret. What a generator sends is one trajectory at a time (two arrays of its
tokens: ~220 kB at 27,648 tokens), what rank 0 sends is requests and control messages, so one
pickle in band per message costs nothing that matters.
"""

from __future__ import annotations

import pickle
import socket
import struct
import time
from collections import deque

from areal_hpc.wire.lifeline import JOIN, connect
from areal_hpc.wire.transport import POLL_S, Channel, Mailbox

_LENGTH = struct.Struct("!Q")
# Bytes read from a link per system call.
READ_BYTES = 1 << 20


class Link:
    """One peer over a TCP socket: `send` queues a frame and writes what the socket takes now;
    `receive` writes more of the queue and returns the messages complete so far. Never blocks."""

    def __init__(self, sock: socket.socket) -> None:
        sock.setblocking(False)
        self.sock = sock
        self._out = bytearray()
        self._in = bytearray()
        self.closed = False

    def send(self, msg: object) -> None:
        data = pickle.dumps(msg, protocol=5)
        self._out += _LENGTH.pack(len(data)) + data
        self._write()

    @property
    def pending(self) -> int:
        """Bytes queued but not yet taken by the socket."""
        return len(self._out)

    def _write(self) -> None:
        while self._out and not self.closed:
            try:
                n = self.sock.send(self._out)
            except (BlockingIOError, InterruptedError):
                return
            except OSError:
                self.closed = True
                return
            del self._out[:n]

    def receive(self) -> list[object]:
        self._write()
        while not self.closed:
            try:
                data = self.sock.recv(READ_BYTES)
            except (BlockingIOError, InterruptedError):
                break
            except OSError:
                data = b""
            if not data:
                self.closed = True
                break
            self._in += data
        out = []
        while len(self._in) >= _LENGTH.size:
            (size,) = _LENGTH.unpack_from(self._in)
            if len(self._in) < _LENGTH.size + size:
                break
            out.append(pickle.loads(self._in[_LENGTH.size:_LENGTH.size + size]))
            del self._in[:_LENGTH.size + size]
        return out

    def close(self) -> None:
        self.closed = True
        self.sock.close()


class LinkChannel(Mailbox):
    """A replacement generator's channel: everything goes to and comes from rank 0, over its link.
    `rank` is the lost generator's rank it took (JoinOffer); until then JOIN."""

    def __init__(self, link: Link) -> None:
        self.link = link
        self.rank = JOIN
        self.comm = None  # not in the MPI world
        self.shutdown_seen = False
        self.finalize = False
        self._inbox: deque[object] = deque()

    @classmethod
    def connect(cls, address: tuple[str, int], secret: str) -> LinkChannel:
        """Reach rank 0's lifeline port and greet as a spare."""
        return cls(Link(connect(address, secret, JOIN)))

    def send(self, dest: int, msg: object) -> None:
        self.link.send(msg)

    def poll(self, source: int | None = None) -> tuple[int, object] | None:
        from areal_hpc.wire.messages import Shutdown

        self._inbox.extend(self.link.receive())
        if not self._inbox:
            if self.link.closed and not self.shutdown_seen:
                raise ConnectionError("rank 0 closed the connection (the run ended or was refused)")
            return None
        msg = self._inbox.popleft()
        if isinstance(msg, Shutdown):
            self.shutdown_seen = True
        return 0, msg

    def flush(self, timeout: float = 10.0) -> bool:
        deadline = time.monotonic() + timeout
        while self.link.pending and not self.link.closed:
            self._inbox.extend(self.link.receive())
            if time.monotonic() > deadline:
                return False
            time.sleep(POLL_S)
        return not self.link.pending

    def forget(self, rank: int) -> None:
        pass


class Hub(Mailbox):
    """Rank 0's mail: the MPI world's channel, and one link per replacement generator, filed under
    the rank it took. A message that still comes over MPI from such a rank is its dead
    predecessor's (sent before it died, read after) and is dropped."""

    def __init__(self, chan: Channel) -> None:
        self.chan = chan
        self.comm, self.rank, self.size = chan.comm, chan.rank, chan.size
        self.links: dict[int, Link] = {}
        self._inbox: deque[tuple[int, object]] = deque()

    @property
    def finalize(self) -> bool:
        return self.chan.finalize

    @finalize.setter
    def finalize(self, value: bool) -> None:
        self.chan.finalize = value

    def attach(self, rank: int, link: Link) -> None:
        self.links[rank] = link

    def send(self, dest: int, msg: object) -> None:
        link = self.links.get(dest)
        if link is None:
            self.chan.send(dest, msg)
        else:
            link.send(msg)

    def poll(self, source: int | None = None) -> tuple[int, object] | None:
        while (got := self.chan.poll(source)) is not None:
            if got[0] not in self.links:
                return got
        if not self._inbox:
            for rank, link in self.links.items():
                self._inbox.extend((rank, msg) for msg in link.receive())
        for i, (rank, msg) in enumerate(self._inbox):
            if source is None or rank == source:
                del self._inbox[i]
                return rank, msg
        return None

    def closed(self) -> list[int]:
        """Ranks whose link closed (their process is gone), detached from now on."""
        gone = [rank for rank, link in self.links.items() if link.closed]
        for rank in gone:
            self.forget(rank)
        return gone

    def forget(self, rank: int) -> None:
        self.chan.forget(rank)
        link = self.links.pop(rank, None)
        if link is not None:
            link.close()
        self._inbox = deque(item for item in self._inbox if item[0] != rank)

    def flush(self, timeout: float = 10.0) -> bool:
        deadline = time.monotonic() + timeout
        while any(link.pending and not link.closed for link in self.links.values()):
            for link in self.links.values():
                link.receive()
            if time.monotonic() > deadline:
                return False
            time.sleep(POLL_S)
        return self.chan.flush(max(0.0, deadline - time.monotonic()))

"""Typed messages between MPI ranks, sent and received without blocking or spinning.

MPICH's blocking receive busy-polls a core, which would take CPU from the trainer and the
generator on a small machine; so every wait here is a probe followed by a short sleep. All
messages use one tag, so the messages from one rank to another arrive in the order sent.

Messages travel with mpi4py.util.pkl5: pickle protocol 5, buffers of 256 KiB or more (large numpy
arrays) out of band, each sent from its own memory without a copy, and no 2 GiB limit on a message
(a paper-scale batch is ~1.2 GB). One message is a few MPI messages (a header, the pickle, one per
out-of-band buffer), sent back to back; `poll` claims the header with a matched probe
(MPI_Improbe), then takes the rest, which are next from that sender.

mpi4py is imported inside functions: a rank that starts vLLM's AsyncLLM must not import it at
module import time (its engine process re-imports the main module).
"""

from __future__ import annotations

import time
from typing import Any

TAG = 11
POLL_S = 0.002


def encode(msg: object) -> tuple[bytes, list[memoryview]]:
    """What Channel puts on the wire for `msg`: pkl5's pickle and out-of-band buffers (for
    measuring and testing the encoding without MPI)."""
    from mpi4py.util import pkl5

    return pkl5.pickle.dumps_oob(msg)


def decode(data: bytes, buffers: list) -> object:
    """The message `encode` made `data` and `buffers` from."""
    from mpi4py.util import pkl5

    return pkl5.pickle.loads_oob(data, buffers)


class Mailbox:
    """Whatever delivers a rank's messages: `poll` is the transport's; waiting is the same for all."""

    rank: int
    shutdown_seen: bool

    def send(self, dest: int, msg: object) -> None:
        raise NotImplementedError

    def poll(self, source: int | None = None) -> tuple[int, object] | None:
        raise NotImplementedError

    def flush(self, timeout: float = 10.0) -> bool:
        raise NotImplementedError

    def recv(self, source: int | None = None, timeout: float | None = None) -> tuple[int, object]:
        """Wait for the next message from `source`, sleeping between probes."""
        deadline = None if timeout is None else time.monotonic() + timeout
        while True:
            got = self.poll(source)
            if got is not None:
                return got
            if deadline is not None and time.monotonic() > deadline:
                raise TimeoutError(f"rank {self.rank}: no message from rank {source} in {timeout} s")
            time.sleep(POLL_S)


class Channel(Mailbox):
    def __init__(self, comm: Any) -> None:
        from mpi4py.util import pkl5

        # `comm` for everything else (Abort, sub-communicators); its pkl5 view for messages.
        self.comm = comm
        self._wire = pkl5.Intracomm(comm)
        self.rank: int = comm.Get_rank()
        self.size: int = comm.Get_size()
        self._pending: list[tuple[int, Any]] = []  # (destination, request)
        # Set once a Shutdown arrived: from then on rank 0 going away is the expected end.
        self.shutdown_seen = False
        # False once a Shutdown said a rank of the world is gone (no MPI_Finalize then).
        self.finalize = True

    def send(self, dest: int, msg: object) -> None:
        """Queue `msg` for `dest`; returns at once (large messages complete in the background).
        Arrays of 256 KiB or more are sent from their own memory: do not modify them in place
        until `flush` (nothing in the system does; replacing a field is fine)."""
        self._pending.append((dest, self._wire.isend(msg, dest=dest, tag=TAG)))
        self._reap()

    def _reap(self) -> None:
        self._pending = [(d, r) for d, r in self._pending if not r.test()[0]]

    def forget(self, rank: int) -> None:
        """`rank` is dead: stop waiting for its sends, which would never complete."""
        self._pending = [(d, r) for d, r in self._pending if d != rank]

    def poll(self, source: int | None = None) -> tuple[int, object] | None:
        """The next message from `source` (any rank when None), or None if there is none yet."""
        from mpi4py import MPI

        self._reap()
        status = MPI.Status()
        src = MPI.ANY_SOURCE if source is None else source
        matched = self._wire.improbe(source=src, tag=TAG, status=status)
        if matched is None:
            return None
        from areal_hpc.wire.messages import Shutdown

        sender = status.Get_source()
        msg = matched.recv()
        if isinstance(msg, Shutdown):
            self.shutdown_seen = True
            self.finalize = msg.finalize
        return sender, msg

    def flush(self, timeout: float = 10.0) -> bool:
        """Wait until every queued send completed; False on timeout."""
        deadline = time.monotonic() + timeout
        while self._pending:
            self._reap()
            if time.monotonic() > deadline:
                return False
            time.sleep(POLL_S)
        return True

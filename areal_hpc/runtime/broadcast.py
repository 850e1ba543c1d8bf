"""One message from a root to every rank of a small communicator, as an MPI collective, polled.

The trainer ranks of one data-parallel replica take each controller command this way from their
root (runtime/trainer_rank.py). A collective, so MPI runs it as a tree (binomial, or scatter then
allgather for long messages): no rank sends one copy per receiver. The communicator is made by
its members alone (MPI_Comm_create_group), so rank 0 and the generators take no part. Nonblocking
(MPI_Ibcast) with a short sleep between tests, as in transport.py: the replica waits for its next
command through the whole of generation, and a blocking MPI_Bcast would busy-poll a core meanwhile.
"""

from __future__ import annotations

import time
from typing import Any

import numpy as np

from areal_hpc.wire.transport import POLL_S, decode, encode

ROOT = 0


def group_comm(comm: Any, ranks: list[int]) -> Any:
    """A communicator of `ranks` of `comm`, in that order (ranks[0] is its ROOT); collective over
    `ranks` only."""
    return comm.Create_group(comm.Get_group().Incl(ranks))


def _wait(request: Any) -> None:
    while not request.Test():
        time.sleep(POLL_S)


def broadcast(comm: Any, msg: object = None) -> object:
    """`msg` of comm's ROOT on every rank of `comm` (the others pass nothing); collective.

    Encoded as Channel encodes it (transport.encode: a small pickle, and a batch's arrays as
    out-of-band buffers, broadcast from their own memory): the sizes, the pickle, then each buffer."""
    if comm.Get_size() == 1:
        return msg
    root = comm.Get_rank() == ROOT
    if root:
        data, buffers = encode(msg)
        parts: list[Any] = [data, *buffers]
        sizes = np.array([memoryview(b).nbytes for b in parts], dtype=np.int64)
    count = np.array([len(sizes) if root else 0], dtype=np.int64)
    _wait(comm.Ibcast(count, root=ROOT))
    if not root:
        sizes = np.empty(int(count[0]), dtype=np.int64)
    _wait(comm.Ibcast(sizes, root=ROOT))
    if not root:
        parts = [bytearray(int(n)) for n in sizes]
    for part in parts:
        _wait(comm.Ibcast(part, root=ROOT))
    return msg if root else decode(bytes(parts[0]), parts[1:])

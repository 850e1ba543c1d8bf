"""The weight-transfer protocol between a trainer stage leader and every vLLM worker.

One weight group per pipeline stage: rank 0 is the stage's leading trainer rank (the sender), the
other ranks are the vLLM workers of every generator. One update over one group:

1. the sender broadcasts a header: the policy version and every tensor's name, dtype and shape,
   grouped in buckets;
2. every member adds up its refusal (a receiver refuses a header that does not match the model it
   serves), so a single refusal cancels the update everywhere before any weight changes;
3. the sender broadcasts every tensor as it is (no packing copy); a receiver posts the receives of
   the next bucket before it loads the current one, so loading overlaps the wire.

This module is torch-only so a trainer rank can send without importing vLLM; the receiving vLLM
engine is areal_hpc/rollout/weight_receiver.py. The transport is a gloo group on CPU and vLLM's
NCCL communicator on GPU (the one vLLM's own NCCL weight-transfer engine uses).

Joining a group waits for every member: the sender as soon as its trainer has loaded the model, a
generator only once its engine has started, minutes later on GPUs. vLLM's helper for the NCCL
group (weight_transfer/nccl_common.py stateless_init_process_group) makes its TCP store with
StatelessProcessGroup.create's default store_timeout of 300 s, after which the sender's store
gives up on the members still missing; so `Link` makes that store itself with the run's
startup_timeout_s, the deadline by which the controller names a rank that is not ready.

A member dying mid-update fails the update on both transports with WeightTransferError, whose
callers (runtime/trainer_rank.py, runtime/generator_rank.py through Generator.update_weights)
report it, so the controller sends the update again to a group without the dead member. Gloo's
collectives fail by themselves (a closed socket, or the group's timeout); an NCCL collective only
spins on the GPU, so the NCCL link polls each one's end and the communicator's asynchronous
error, and aborts the communicator after the same timeout (`wait_until`).
"""

from __future__ import annotations

import contextlib
import ctypes
import datetime
import json
import time
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass
from typing import Any

import torch

from areal_hpc.errors import UserError, listed

# Row length of the checksum's word matrix (any constant gives the same digest).
_WORDS_PER_ROW = 4096
_MASK64 = (1 << 64) - 1
BACKENDS = ("gloo", "nccl")
# Seconds joining a group waits when the caller names no deadline: startup_timeout_s's default.
DEFAULT_TIMEOUT_S = 1800.0
FLOAT_DTYPES = ("float32", "bfloat16", "float16")
# Names listed in full in a refusal before the rest are counted.
_LISTED = 5
# Seconds between two polls of an NCCL collective's end: the host learns of it at most this late,
# while the wire stays busy with the next bucket, queued behind it.
POLL_S = 1e-3
# ncclResult_t values of ncclCommGetAsyncError that are no error (nccl.h: ncclSuccess, ncclInProgress).
_NCCL_NO_ERROR = (0, 7)


class WeightMismatch(UserError):
    """A weight update whose tensors do not match the served model; no weights were changed."""


class WeightTransferError(RuntimeError):
    """The transport failed during an update."""


@dataclass(frozen=True)
class TensorSpec:
    """One tensor of an update: its Hugging Face name, dtype name (torch) and shape."""

    name: str
    dtype: str
    shape: tuple[int, ...]

    @classmethod
    def of(cls, name: str, t: torch.Tensor) -> TensorSpec:
        return cls(name, str(t.dtype).removeprefix("torch."), tuple(t.shape))


@dataclass
class Header:
    """What the sender announces before any tensor: the version and the tensors, bucket by bucket."""

    version: int
    buckets: list[list[TensorSpec]]

    @property
    def specs(self) -> Iterator[TensorSpec]:
        return (spec for bucket in self.buckets for spec in bucket)

    def encode(self) -> bytes:
        buckets = [[[s.name, s.dtype, list(s.shape)] for s in b] for b in self.buckets]
        return json.dumps({"version": self.version, "buckets": buckets}).encode()

    @classmethod
    def decode(cls, data: bytes) -> Header:
        raw = json.loads(data)
        return cls(raw["version"], [[TensorSpec(n, d, tuple(s)) for n, d, s in b] for b in raw["buckets"]])

    @classmethod
    def of(cls, version: int, buckets: list[list[tuple[str, torch.Tensor]]]) -> Header:
        """The header of `buckets`; their tensors may be on the meta device (a plan, no data)."""
        return cls(version, [[TensorSpec.of(n, t) for n, t in b] for b in buckets])


def mismatches(headers: list[Header], shapes: dict[str, tuple[int, ...]], version: int) -> list[str]:
    """Why the headers of one update (one per weight group) cannot load into a model of `shapes`.

    An update must name every tensor of the model exactly once, with the model's shape and a
    floating dtype, and carry the version the generator was told to load.
    """
    problems, seen, unknown, duplicated = [], set(), [], []
    for header in headers:
        if header.version != version:
            problems.append(f"the sender announces version {header.version} but the generator expects {version}")
        for spec in header.specs:
            if spec.name in seen:
                duplicated.append(spec.name)
            seen.add(spec.name)
            if spec.name not in shapes:
                unknown.append(spec.name)
            elif spec.shape != shapes[spec.name]:
                problems.append(f"tensor {spec.name!r} has shape {list(spec.shape)} but the model's is "
                                f"{list(shapes[spec.name])}")
            if spec.dtype not in FLOAT_DTYPES:
                problems.append(f"tensor {spec.name!r} has dtype {spec.dtype}; weights must be one of {FLOAT_DTYPES}")
    for what, names in (("not in the model", unknown), ("sent more than once", duplicated),
                        ("of the model not sent", sorted(shapes.keys() - seen))):
        if names:
            problems.append(f"{len(names)} tensor(s) {what}: {listed(names, _LISTED)}")
    return problems


def checksum(t: torch.Tensor) -> str:
    """Digest of a tensor's bytes: the sum and the position-weighted sum of its 64-bit words, mod 2^64.

    Integer sums are exact on any device and in any reduction order, so a trainer's export and a
    generator's received copy agree bit for bit; the position weights catch moved words. The words
    are summed as a (rows, _WORDS_PER_ROW) matrix, by rows and by columns: sum_i w_i * (i + 1) =
    C * sum_r r * rowsum_r + sum_c (c + 1) * colsum_c, which needs no temporary of the tensor's size.
    """
    return _hex(_digest(t).cpu().tolist())


class Digests:
    """The `checksum` of every tensor of an update, computed on its device as it passes and read with
    one host synchronisation at the end: a read per bucket would make the host wait for that
    bucket's transfer before it gathers or receives the next (16 device bytes per tensor meanwhile;
    int64 arithmetic wraps mod 2^64, which is the digest's arithmetic)."""

    def __init__(self) -> None:
        self._names: list[str] = []
        self._parts: list[torch.Tensor] = []

    def add(self, named: list[tuple[str, torch.Tensor]]) -> None:
        if named:
            self._names += [n for n, _ in named]
            self._parts.append(torch.stack([_digest(t) for _, t in named]))

    def read(self) -> dict[str, str]:
        if not self._parts:
            return {}
        pairs = torch.cat(self._parts).cpu().tolist()
        return {name: _hex(pair) for name, pair in zip(self._names, pairs, strict=True)}


def _hex(pair: list[int]) -> str:
    total, weighted = pair
    return f"{total & _MASK64:016x}{weighted & _MASK64:016x}"


def _digest(t: torch.Tensor) -> torch.Tensor:
    """[sum, position-weighted sum] of the tensor's 64-bit words, as a device int64 pair."""
    data = t.detach().contiguous().view(-1).view(torch.uint8)
    if data.storage_offset() % 8:
        data = data.clone()
    n = data.numel() // 8
    words = data[: 8 * n].view(torch.int64)
    rows = n // _WORDS_PER_ROW
    body = words[: rows * _WORDS_PER_ROW].view(rows, _WORDS_PER_ROW)
    rest = torch.cat([words[rows * _WORDS_PER_ROW :], _last_word(data[8 * n :])])
    rowsum, colsum = body.sum(dim=1), body.sum(dim=0)

    def positions(start: int, count: int) -> torch.Tensor:
        return torch.arange(start, start + count, dtype=torch.int64, device=data.device)

    total = rowsum.sum() + rest.sum()
    weighted = (
        _WORDS_PER_ROW * (positions(0, rows) * rowsum).sum()
        + (positions(1, _WORDS_PER_ROW) * colsum).sum()
        + (positions(rows * _WORDS_PER_ROW + 1, rest.numel()) * rest).sum()
    )
    return torch.stack([total, weighted])


def _last_word(tail: torch.Tensor) -> torch.Tensor:
    """The 0-7 bytes after the last whole word, zero-padded into one word (or none)."""
    if tail.numel() == 0:
        return torch.zeros(0, dtype=torch.int64, device=tail.device)
    padded = torch.zeros(8, dtype=torch.uint8, device=tail.device)
    padded[: tail.numel()] = tail
    return padded.view(torch.int64)


def group_name(host: str, port: int, rank: int, world_size: int) -> str:
    """How errors name one member of a weight group."""
    return f"weight group at {host}:{port}, rank {rank} of {world_size}"


def rendezvous(host: str, port: int, rank: int, world_size: int, timeout_s: float):
    """vLLM's StatelessProcessGroup over a TCP store at host:port (rank 0 its server) once all
    `world_size` members joined, each waiting at most `timeout_s`: the NCCL link's bootstrap.

    The store is made here rather than by StatelessProcessGroup.create, which fixes its wait and,
    when the wait ends, hides torch's "timed out waiting for clients" behind an EBADF of its own
    (distributed/utils.py create_tcp_store closes a descriptor the store already closed)."""
    from torch.distributed import TCPStore
    from vllm.distributed.utils import StatelessProcessGroup

    try:
        store = TCPStore(host_name=host, port=port, world_size=world_size, is_master=rank == 0,
                         timeout=datetime.timedelta(seconds=timeout_s), use_libuv=False)
    except RuntimeError as e:  # torch's DistStoreError and its connection errors
        first = str(e).splitlines()[0]  # torch appends its C++ stack
        raise WeightTransferError(f"{group_name(host, port, rank, world_size)}: {first}") from e
    return StatelessProcessGroup(rank=rank, world_size=world_size, store=store)


def wait_until(done: Callable[[], bool], error: Callable[[], str | None], abort: Callable[[], None],
               what: str, timeout_s: float, started: float, clock: Callable[[], float] = time.monotonic,
               sleep: Callable[[float], None] = time.sleep, poll_s: float = POLL_S) -> None:
    """Return once `done()`; when `error()` names a problem first, or `timeout_s` passed since
    `started` (the collective's queueing, on `clock`), call `abort()` and raise WeightTransferError
    naming `what`. A collective done despite an error is no success: the error is asked first.

    An NCCL collective whose peer died spins on the GPU with no timeout and no error of its own;
    only the communicator's asynchronous error and a deadline tell, and only an abort frees it.
    """
    while (problem := error()) is None and not done():
        if clock() - started >= timeout_s:
            problem = f"not done {timeout_s:g} s after it was queued (a member of the group died or hangs)"
            break
        sleep(poll_s)
    if problem is not None:
        abort()
        raise WeightTransferError(f"{what}: {problem}; the communicator was aborted")


def check_communicator(comm: Any, where: str, env_disabled: bool, load_error: Callable[[], str]) -> None:
    """Raise WeightTransferError when vLLM built `comm` (a PyNcclCommunicator) disabled, which it does
    without a word when the NCCL library does not load: its collectives then return at once and
    send nothing. `load_error()` says why the library did not load (asked only then)."""
    if comm.available and not comm.disabled:
        return
    if comm.world_size == 1:
        why = "a group of one member has no communicator"
    elif env_disabled:
        why = "VLLM_DISABLE_PYNCCL is set"
    else:
        why = (f"the NCCL library did not load ({load_error()}); set VLLM_NCCL_SO_PATH to the libnccl.so.2 "
               "of this CUDA")
    raise WeightTransferError(f"{where}: vLLM's NCCL communicator is disabled: {why}")


def nccl_load_error() -> str:
    """Why vLLM's NCCLLibrary does not load, asked again: the communicator keeps only a flag."""
    from vllm.distributed.device_communicators.pynccl_wrapper import NCCLLibrary

    try:
        NCCLLibrary()
    except Exception as e:  # ValueError without a CUDA torch, OSError for a missing file, a missing symbol
        return f"{type(e).__name__}: {e}"
    return "it loads now, but did not when the communicator was built"


@contextlib.contextmanager
def kept_stream(device: torch.device) -> Iterator[None]:
    """Keep the calling thread's current CUDA stream across vLLM's communicator construction: its
    warm-up (pynccl.py _init_comm) takes vllm.utils.torch_utils.current_stream(), which on a thread
    that never set one makes a new stream and sets it current, so a trainer stage leader would go
    on training on a side stream while its TP peers use the default one. No-op off CUDA."""
    if device.type != "cuda":
        yield
        return
    saved = torch.cuda.current_stream()
    try:
        yield
    finally:
        torch.cuda.set_stream(saved)  # vLLM's patched set_stream: its current_stream() follows


def nccl_async_error(comm: Any) -> Callable[[], str | None]:
    """A query of ncclCommGetAsyncError on vLLM's communicator `comm`, which the pinned wrapper
    (pynccl_wrapper.py) does not bind: where a peer's death shows (ncclRemoteError, ncclSystemError)
    while the collective itself spins on. Bound on its own prototype, so vLLM's functions keep theirs."""
    nccl = comm.nccl
    query = ctypes.CFUNCTYPE(ctypes.c_int, ctypes.c_void_p, ctypes.POINTER(ctypes.c_int))(
        ("ncclCommGetAsyncError", nccl.lib))

    def error() -> str | None:
        if comm.disabled:
            return "the communicator was aborted"
        state = ctypes.c_int()
        result = query(comm.comm, ctypes.byref(state))
        code = result or state.value
        return None if code in _NCCL_NO_ERROR else f"NCCL reports {nccl.ncclGetErrorString(code)}"

    return error


class Link:
    """One weight group seen from one member: broadcast from rank 0 and a sum over all members.

    `timeout_s`: how long joining waits for the other members (runs pass startup_timeout_s), and
    the deadline of each collective on both transports (gloo's own; NCCL's by `wait_until`), so a
    dead member fails an update after the same time on either.
    """

    def __init__(self, backend: str, host: str, port: int, rank: int, world_size: int,
                 timeout_s: float = DEFAULT_TIMEOUT_S) -> None:
        if backend not in BACKENDS:
            raise ValueError(f"weight-transfer backend {backend!r}: must be one of {BACKENDS}")
        self.backend = backend
        self.timeout_s = timeout_s
        self._where = group_name(host, port, rank, world_size)
        if backend == "gloo":
            from vllm.distributed.utils import stateless_init_torch_distributed_process_group

            self.device = torch.device("cpu")
            self._pg = stateless_init_torch_distributed_process_group(
                host, port, rank, world_size, "gloo", timeout=datetime.timedelta(seconds=timeout_s))
        else:
            from vllm import envs
            from vllm.distributed.device_communicators.pynccl import PyNcclCommunicator
            from vllm.utils.nccl import unpinned_nccl_env

            index = torch.accelerator.current_device_index()
            self.device = torch.device("cuda", index)
            group = rendezvous(host, port, rank, world_size, timeout_s)
            with unpinned_nccl_env(), kept_stream(self.device):  # as nccl_common.stateless_init_process_group does
                self._comm = PyNcclCommunicator(group, device=index)
            check_communicator(self._comm, self._where, envs.VLLM_DISABLE_PYNCCL, nccl_load_error)
            # The link's collectives run on a stream of their own, beside the caller's gathers and loads.
            self._stream = torch.cuda.Stream(self.device)
            self._error = nccl_async_error(self._comm)

    def broadcast(self, t: torch.Tensor, what: str = "a broadcast") -> Callable[[], None]:
        """Start broadcasting `t` from rank 0; returns the wait (which keeps `t` alive), which raises
        WeightTransferError naming `what` when the transfer breaks or outlasts `timeout_s`."""
        if self.backend == "gloo":
            return self._gloo_wait(self._pg.broadcast(t, 0), t, what)
        return self._queue_nccl(lambda stream: self._comm.broadcast(t, src=0, stream=stream), t, what)

    def sum(self, value: int) -> int:
        t = torch.tensor([value], dtype=torch.int64, device=self.device)
        what = "the sum over the group"
        if self.backend == "gloo":
            self._gloo_wait(self._pg.allreduce(t), t, what)()
        else:
            self._queue_nccl(lambda stream: self._comm.all_reduce(t, t, stream=stream), t, what)()
        return int(t.item())

    def _gloo_wait(self, work, t: torch.Tensor, what: str) -> Callable[[], None]:
        def wait(_keep_alive: torch.Tensor = t) -> None:
            try:
                work.wait()
            except RuntimeError as e:  # torch's DistBackendError: a peer's closed socket, gloo's timeout
                first = str(e).splitlines()[0]  # torch appends its C++ stack
                raise WeightTransferError(f"{self._where}: {what}: {first}") from e

        return wait

    def _queue_nccl(self, enqueue: Callable[[torch.cuda.Stream], object], t: torch.Tensor,
                    what: str) -> Callable[[], None]:
        """Queue a collective on the link's stream, after the work queued so far on the caller's (which
        made `t`, or last used its memory); the wait polls its end (see `wait_until`). A received
        tensor is final once its wait returned, to any stream."""
        if self._comm.disabled:  # aborted: its collectives would return at once, moving nothing
            raise WeightTransferError(f"{self._where}: {what}: the communicator was aborted by an earlier failure")
        started = time.monotonic()
        self._stream.wait_stream(torch.cuda.current_stream(self.device))
        enqueue(self._stream)
        # The allocator reuses t's memory only after the collective ended, also one given up on.
        t.record_stream(self._stream)
        done = torch.cuda.Event()
        done.record(self._stream)

        def wait(_keep_alive: torch.Tensor = t) -> None:
            # destroy() is vLLM's ncclCommAbort (in a thread, given up on after 5 s) and marks the
            # communicator disabled, so a later close() does not abort it twice.
            wait_until(done.query, self._error, self._comm.destroy, f"{self._where}: {what}", self.timeout_s, started)

        return wait

    def send_header(self, header: Header) -> None:
        data = torch.frombuffer(bytearray(header.encode()), dtype=torch.uint8).to(self.device)
        self.broadcast(torch.tensor([data.numel()], dtype=torch.int64, device=self.device), "the header's size")()
        self.broadcast(data, "the header")()

    def recv_header(self) -> Header:
        size = torch.zeros(1, dtype=torch.int64, device=self.device)
        self.broadcast(size, "the header's size")()
        data = torch.empty(int(size.item()), dtype=torch.uint8, device=self.device)
        self.broadcast(data, "the header")()
        return Header.decode(data.cpu().numpy().tobytes())

    def recv_buckets(self, header: Header) -> Iterator[list[tuple[str, torch.Tensor]]]:
        """Yields each bucket's tensors while the next bucket is already being received.

        The next bucket's receives are queued before the current one's end is awaited, so the wire
        does not idle while the host polls or loads. Every tensor is freshly allocated: vLLM's
        layerwise reload keeps references to loaded tensors until their layer is complete, so
        reused buffers would be overwritten under it.
        """
        if not header.buckets:
            return
        pending = self._start_recv(header.buckets[0])
        for i, bucket in enumerate(header.buckets):
            upcoming = self._start_recv(header.buckets[i + 1]) if i + 1 < len(header.buckets) else None
            tensors = pending()
            pending = upcoming
            yield [(spec.name, t) for spec, t in zip(bucket, tensors, strict=True)]

    def _start_recv(self, bucket: list[TensorSpec]) -> Callable[[], list[torch.Tensor]]:
        """Queue the receives of `bucket`; returns the wait, which returns the received tensors."""
        tensors = [torch.empty(s.shape, dtype=getattr(torch, s.dtype), device=self.device) for s in bucket]
        waits = [self.broadcast(t, f"broadcast of {s.name!r}") for s, t in zip(bucket, tensors, strict=True)]

        def received() -> list[torch.Tensor]:
            _wait_all(waits)
            return tensors

        return received

    def close(self) -> None:
        if self.backend == "gloo":
            from vllm.distributed.utils import stateless_destroy_torch_distributed_process_group

            stateless_destroy_torch_distributed_process_group(self._pg)
        else:
            self._comm.destroy()  # a no-op once aborted


def _wait_all(waits: list[Callable[[], None]]) -> None:
    for wait in waits:
        wait()


class WeightSender:
    """Rank 0 of one weight group: a trainer pipeline-stage leader pushing its stage's weights.

    The constructor blocks until every receiver (`world_size - 1` vLLM workers, who join through
    `Generator.init_weight_group`) has joined, at most `timeout_s` (see Link).
    """

    def __init__(self, host: str, port: int, world_size: int, backend: str = "gloo",
                 timeout_s: float = DEFAULT_TIMEOUT_S) -> None:
        if world_size < 2:
            raise ValueError(f"weight group world_size = {world_size}: needs the sender and >= 1 receiver")
        self._link = Link(backend, host, port, 0, world_size, timeout_s)
        # Seconds of the last send from the receivers' acceptance to the last bucket on the wire.
        self.transfer_s = 0.0

    def send(self, version: int, buckets: Iterable[list[tuple[str, torch.Tensor]]],
             plan: list[list[tuple[str, torch.Tensor]]] | None = None) -> dict[str, str]:
        """Push one update; returns the checksum of every tensor sent (see `checksum`).

        `buckets` holds (Hugging Face name, tensor) lists; the receivers load bucket by bucket. With
        `plan` (the same buckets' names, dtypes and shapes, e.g. as meta tensors) the buckets are
        taken from the stream as they go on the wire, at most two alive at once (the one on the
        wire and the next, gathered meanwhile); without it they are listed first, which is fine
        only where the tensors exist anyway (a checkpoint read from disk). Every generator must
        call `update_weights(version)` at the same time. Raises WeightMismatch when a receiver
        refused the header (its own error says why); no receiver changed its weights.
        """
        if plan is None:
            buckets = plan = list(buckets)
        header = Header.of(version, plan)
        self._link.send_header(header)
        stream = iter(buckets)
        refusals = self._link.sum(0)
        if refusals:
            for _ in stream:  # the stage's other TP ranks gather in step: finish with them
                pass
            raise WeightMismatch(
                f"weight update to version {version} refused by {refusals} receiver(s) "
                "(name, shape, dtype or version mismatch; the generator's error names the tensors)"
            )
        start = time.perf_counter()
        digests = Digests()
        waits = self._queue(self._next(stream, header.buckets, 0), digests)
        for i in range(len(header.buckets)):
            # Bucket i + 1 is gathered while bucket i is on the wire, and queued behind it before
            # bucket i's end is awaited, so the wire does not idle while the host polls. Nothing
            # may keep bucket i alive once its wait returned: the waits hold its tensors.
            upcoming = self._queue(self._next(stream, header.buckets, i + 1), digests)
            _wait_all(waits)
            waits = upcoming
        self.transfer_s = time.perf_counter() - start
        return digests.read()

    def _queue(self, bucket: list[tuple[str, torch.Tensor]], digests: Digests) -> list[Callable[[], None]]:
        """Start broadcasting `bucket` and take its checksums meanwhile; returns the waits."""
        waits = [self._link.broadcast(t, f"broadcast of {n!r}") for n, t in bucket]
        digests.add(bucket)
        return waits

    def _next(self, stream: Iterator[list[tuple[str, torch.Tensor]]], planned: list[list[TensorSpec]],
              index: int) -> list[tuple[str, torch.Tensor]]:
        """Bucket `index` of the stream on the link's device, checked against the header sent."""
        bucket = next(stream, None)
        if index == len(planned):
            if bucket is not None:
                raise RuntimeError(f"the weight stream has more than the {len(planned)} buckets of its plan")
            return []
        if bucket is None:
            raise RuntimeError(f"the weight stream ended after {index} of the {len(planned)} planned buckets")
        moved = [(n, t.detach().to(self._link.device).contiguous()) for n, t in bucket]
        if [TensorSpec.of(n, t) for n, t in moved] != planned[index]:
            raise RuntimeError(f"bucket {index} of the weight stream differs from its plan (names, dtypes or shapes)")
        return moved

    def close(self) -> None:
        self._link.close()


def bucketed(tensors: Iterable[tuple[str, torch.Tensor]], bucket_bytes: int) -> Iterator[list[tuple[str, torch.Tensor]]]:
    """Groups (name, tensor) pairs in order into buckets of at most `bucket_bytes` (or one tensor)."""
    bucket: list[tuple[str, torch.Tensor]] = []
    size = 0
    for name, t in tensors:
        n = t.numel() * t.element_size()
        if bucket and size + n > bucket_bytes:
            yield bucket
            bucket, size = [], 0
        bucket.append((name, t))
        size += n
    if bucket:
        yield bucket

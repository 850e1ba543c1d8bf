"""The weight-transfer protocol between a trainer stage leader and every vLLM worker.

One weight group per pipeline stage: rank 0 is the stage's leading trainer rank (the sender), the
other ranks are the vLLM workers of every generator. One update over one group:

1. the sender broadcasts a header: the policy version and every tensor's name, dtype, shape and
   place in a bucket;
2. every member adds up its refusal (a receiver refuses a header that does not match the model it
   serves), so a single refusal cancels the update everywhere before any weight changes;
3. the sender broadcasts each bucket as one flat byte buffer, packing the next bucket while the
   previous one is on the wire.

This module is torch-only so a trainer rank can send without importing vLLM; the receiving vLLM
engine is areal_hpc/rollout/weight_receiver.py. The transport is a gloo group on CPU and vLLM's
NCCL communicator on GPU (the one vLLM's own NCCL weight-transfer engine uses).
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass

import torch

from areal_hpc.errors import UserError

# Byte alignment of every tensor inside a bucket, so a received slice can be viewed as any dtype.
_ALIGN = 64
# Elements per step of the checksum, bounding its temporary int64 memory (128 MiB).
_CHECKSUM_CHUNK = 1 << 24
_INT_OF_SIZE = {1: torch.uint8, 2: torch.int16, 4: torch.int32, 8: torch.int64}
_MASK64 = (1 << 64) - 1
BACKENDS = ("gloo", "nccl")
FLOAT_DTYPES = ("float32", "bfloat16", "float16")
# Names listed in full in a refusal before the rest are counted.
_LISTED = 5


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

    @property
    def nbytes(self) -> int:
        n = torch.empty((), dtype=getattr(torch, self.dtype)).element_size()
        for d in self.shape:
            n *= d
        return n


@dataclass
class Header:
    """What the sender announces before any tensor: version and bucket layout."""

    version: int
    # buckets[i] = [(spec, byte offset in bucket i), ...]
    buckets: list[list[tuple[TensorSpec, int]]]
    bucket_bytes: list[int]

    @property
    def specs(self) -> Iterator[TensorSpec]:
        return (spec for bucket in self.buckets for spec, _ in bucket)

    def encode(self) -> bytes:
        buckets = [[[s.name, s.dtype, list(s.shape), off] for s, off in b] for b in self.buckets]
        return json.dumps({"version": self.version, "buckets": buckets, "bytes": self.bucket_bytes}).encode()

    @classmethod
    def decode(cls, data: bytes) -> Header:
        raw = json.loads(data)
        buckets = [[(TensorSpec(n, d, tuple(s)), off) for n, d, s, off in b] for b in raw["buckets"]]
        return cls(raw["version"], buckets, raw["bytes"])

    @classmethod
    def layout(cls, version: int, buckets: list[list[tuple[str, torch.Tensor]]]) -> Header:
        placed, sizes = [], []
        for bucket in buckets:
            entries, offset = [], 0
            for name, t in bucket:
                entries.append((TensorSpec(name, str(t.dtype).removeprefix("torch."), tuple(t.shape)), offset))
                offset += -(-t.numel() * t.element_size() // _ALIGN) * _ALIGN
            placed.append(entries)
            sizes.append(offset)
        return cls(version, placed, sizes)


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
            more = f" and {len(names) - _LISTED} more" if len(names) > _LISTED else ""
            problems.append(f"{len(names)} tensor(s) {what}: {', '.join(names[:_LISTED])}{more}")
    return problems


def checksum(t: torch.Tensor) -> str:
    """Order-independent, device-independent digest of a tensor's bits (two sums mod 2^64).

    Integer sums are exact on any device and in any reduction order, so the trainer's export and
    a generator's received copy agree bit for bit; the position-weighted sum catches permutations.
    """
    flat = t.detach().contiguous().view(-1)
    bits = flat.view(_INT_OF_SIZE[flat.element_size()])
    total = weighted = 0
    for start in range(0, bits.numel(), _CHECKSUM_CHUNK):
        part = bits[start : start + _CHECKSUM_CHUNK].to(torch.int64)
        pos = torch.arange(start + 1, start + 1 + part.numel(), dtype=torch.int64, device=part.device)
        total += int(part.sum())
        weighted += int((part * pos).sum())
    return f"{total & _MASK64:016x}{weighted & _MASK64:016x}"


class Link:
    """One weight group seen from one member: broadcast from rank 0 and a sum over all members."""

    def __init__(self, backend: str, host: str, port: int, rank: int, world_size: int) -> None:
        if backend not in BACKENDS:
            raise ValueError(f"weight-transfer backend {backend!r}: must be one of {BACKENDS}")
        self.backend = backend
        self.rank = rank
        if backend == "gloo":
            from vllm.distributed.utils import stateless_init_torch_distributed_process_group

            self.device = torch.device("cpu")
            self._pg = stateless_init_torch_distributed_process_group(host, port, rank, world_size, "gloo")
        else:
            from vllm.distributed.weight_transfer.nccl_common import stateless_init_process_group

            index = torch.accelerator.current_device_index()
            self.device = torch.device("cuda", index)
            self._comm = stateless_init_process_group(host, port, rank, world_size, index)

    def broadcast(self, t: torch.Tensor) -> Callable[[], None]:
        """Start broadcasting `t` from rank 0; returns the wait (which keeps `t` alive)."""
        # NCCL is stream-ordered (later work on the stream waits for it); gloo returns a Work.
        work = self._pg.broadcast(t, 0) if self.backend == "gloo" else self._comm.broadcast(t, src=0)

        def wait(_keep_alive: torch.Tensor = t) -> None:
            if work is not None:
                work.wait()

        return wait

    def sum(self, value: int) -> int:
        t = torch.tensor([value], dtype=torch.int64, device=self.device)
        if self.backend == "gloo":
            self._pg.allreduce(t).wait()
        else:
            t = self._comm.all_reduce(t)
        return int(t.item())

    def send_header(self, header: Header) -> None:
        data = torch.frombuffer(bytearray(header.encode()), dtype=torch.uint8).to(self.device)
        self.broadcast(torch.tensor([data.numel()], dtype=torch.int64, device=self.device))()
        self.broadcast(data)()

    def recv_header(self) -> Header:
        size = torch.zeros(1, dtype=torch.int64, device=self.device)
        self.broadcast(size)()
        data = torch.empty(int(size.item()), dtype=torch.uint8, device=self.device)
        self.broadcast(data)()
        return Header.decode(data.cpu().numpy().tobytes())

    def recv_buckets(self, header: Header) -> Iterator[list[tuple[str, torch.Tensor]]]:
        """Yields each bucket's tensors while the next bucket is already being received.

        Every bucket gets a fresh buffer: vLLM's layerwise reload keeps references to loaded
        tensors until their layer is complete, so a reused buffer would be overwritten under it.
        """
        if not header.buckets:
            return
        current = self._start_recv(header.bucket_bytes[0])
        for i, bucket in enumerate(header.buckets):
            buf, wait = current
            wait()
            if i + 1 < len(header.buckets):
                current = self._start_recv(header.bucket_bytes[i + 1])
            yield [(spec.name, _view(buf, spec, offset)) for spec, offset in bucket]

    def _start_recv(self, nbytes: int) -> tuple[torch.Tensor, Callable[[], None]]:
        buf = torch.empty(nbytes, dtype=torch.uint8, device=self.device)
        return buf, self.broadcast(buf)

    def close(self) -> None:
        if self.backend == "gloo":
            from vllm.distributed.utils import stateless_destroy_torch_distributed_process_group

            stateless_destroy_torch_distributed_process_group(self._pg)
        else:
            self._comm.destroy()


def _view(buf: torch.Tensor, spec: TensorSpec, offset: int) -> torch.Tensor:
    return buf[offset : offset + spec.nbytes].view(getattr(torch, spec.dtype)).view(spec.shape)


def _pack(bucket: list[tuple[str, torch.Tensor]], entries: list[tuple[TensorSpec, int]], nbytes: int,
          device: torch.device) -> torch.Tensor:
    buf = torch.empty(nbytes, dtype=torch.uint8, device=device)
    for (_, t), (spec, offset) in zip(bucket, entries, strict=True):
        buf[offset : offset + spec.nbytes].copy_(t.detach().contiguous().view(-1).view(torch.uint8))
    return buf


class WeightSender:
    """Rank 0 of one weight group: a trainer pipeline-stage leader pushing its stage's weights.

    The constructor blocks until every receiver (`world_size - 1` vLLM workers, who join through
    `Generator.init_weight_group`) has joined.
    """

    def __init__(self, host: str, port: int, world_size: int, backend: str = "gloo") -> None:
        if world_size < 2:
            raise ValueError(f"weight group world_size = {world_size}: needs the sender and >= 1 receiver")
        self._link = Link(backend, host, port, 0, world_size)
        # Seconds of the last send from the receivers' acceptance to the last bucket on the wire.
        self.transfer_s = 0.0

    def send(self, version: int, buckets: Iterable[list[tuple[str, torch.Tensor]]]) -> dict[str, str]:
        """Push one update; returns the checksum of every tensor sent (see `checksum`).

        `buckets` holds (Hugging Face name, tensor) lists, each sent as one broadcast. Every
        generator must call `update_weights(version)` at the same time. Raises WeightMismatch when
        a receiver refused the header (its own error says why); no receiver changed its weights.
        """
        buckets = [list(b) for b in buckets]
        header = Header.layout(version, buckets)
        self._link.send_header(header)
        refusals = self._link.sum(0)
        if refusals:
            raise WeightMismatch(
                f"weight update to version {version} refused by {refusals} receiver(s) "
                "(name, shape, dtype or version mismatch; the generator's error names the tensors)"
            )
        start = time.perf_counter()
        sums: dict[str, str] = {}
        pending: Callable[[], None] | None = None
        for bucket, entries, nbytes in zip(buckets, header.buckets, header.bucket_bytes, strict=True):
            buf = _pack(bucket, entries, nbytes, self._link.device)
            if pending is not None:
                pending()
            pending = self._link.broadcast(buf)
            sums.update((name, checksum(t)) for name, t in bucket)
        if pending is not None:
            pending()
        self.transfer_s = time.perf_counter() - start
        return sums

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

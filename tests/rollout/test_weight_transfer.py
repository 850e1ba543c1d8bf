"""The weight-transfer protocol without an engine: header, checks, checksums, and a real gloo group."""

from __future__ import annotations

import multiprocessing as mp
from contextlib import contextmanager

import pytest
import torch
from rollout_processes import free_port

from areal_hpc.rollout import weight_transfer
from areal_hpc.rollout.weight_transfer import (
    Header,
    Link,
    TensorSpec,
    WeightMismatch,
    WeightSender,
    bucketed,
    checksum,
    mismatches,
)

SHAPES = {"a.weight": (4, 3), "a.bias": (4,), "b.weight": (2, 2)}


def named(dtype: torch.dtype = torch.float32) -> list[tuple[str, torch.Tensor]]:
    g = torch.Generator().manual_seed(0)
    return [(n, torch.randn(s, generator=g).to(dtype)) for n, s in SHAPES.items()]


def test_header_round_trip():
    tensors = named(torch.bfloat16) + [("scalar", torch.tensor(2.0))]
    header = Header.of(7, [tensors[:2], tensors[2:]])
    assert Header.decode(header.encode()) == header
    assert header.version == 7
    assert header.buckets[1] == [TensorSpec("b.weight", "bfloat16", (2, 2)), TensorSpec("scalar", "float32", ())]


def test_a_matching_update_has_no_mismatches():
    assert mismatches([Header.of(3, [named()])], SHAPES, 3) == []
    # split over two pipeline stages, any bucketing
    stages = [Header.of(3, [named()[:1]]), Header.of(3, [named()[1:2], named()[2:]])]
    assert mismatches(stages, SHAPES, 3) == []


@pytest.mark.parametrize(
    "tensors, version, expected",
    [
        (named()[:2], 3, "1 tensor(s) of the model not sent: b.weight"),
        (named() + [("c.weight", torch.zeros(1))], 3, "1 tensor(s) not in the model: c.weight"),
        (named() + named()[:1], 3, "1 tensor(s) sent more than once: a.weight"),
        (named()[:2] + [("b.weight", torch.zeros(2, 3))], 3, "'b.weight' has shape [2, 3] but the model's is [2, 2]"),
        (named()[:2] + [("b.weight", torch.zeros(2, 2, dtype=torch.int32))], 3, "'b.weight' has dtype int32"),
        (named(), 4, "the sender announces version 3 but the generator expects 4"),
    ],
)
def test_every_mismatch_is_named(tensors, version, expected):
    problems = mismatches([Header.of(3, [tensors])], SHAPES, version)
    assert any(expected in p for p in problems), problems


def test_many_unknown_names_are_counted_not_all_listed():
    extra = [(f"x{i}", torch.zeros(1)) for i in range(9)]
    (problem,) = mismatches([Header.of(0, [named() + extra])], SHAPES, 0)
    assert problem == "9 tensor(s) not in the model: x0, x1, x2, x3, x4 and 4 more"


def test_checksum_sees_bits_and_positions_not_memory_layout(monkeypatch):
    t = torch.randn(50, 7)
    assert checksum(t) == checksum(t.clone()) == checksum(t.t().contiguous().t())
    assert checksum(t) != checksum(t.flip(0))  # same values, other positions
    flipped = t.clone()
    flipped.view(torch.int32)[3, 2] ^= 1  # one bit
    assert checksum(t) != checksum(flipped)
    assert checksum(t.to(torch.bfloat16)) != checksum(t.to(torch.float16))
    # the row/column decomposition is the plain position-weighted sum of 64-bit words, for any row
    # length, with a partial last row and a partial last word
    odd = torch.randn(1002)[1:]  # 4004 bytes: 500 words and 4 bytes, at an unaligned storage offset
    raw = odd.numpy().tobytes() + bytes(4)
    words = [int.from_bytes(raw[i : i + 8], "little", signed=True) for i in range(0, len(raw), 8)]
    mask = (1 << 64) - 1
    plain = f"{sum(words) & mask:016x}{sum(w * (i + 1) for i, w in enumerate(words)) & mask:016x}"
    for row in (7, 64, 4096):
        monkeypatch.setattr(weight_transfer, "_WORDS_PER_ROW", row)
        assert checksum(odd) == plain
    half = torch.randn(7).to(torch.float16)  # 14 bytes: one word and 6 bytes
    assert checksum(half) != checksum(torch.cat([half[:6], half[6:] + 1]))


def test_bucketed_respects_the_budget_and_keeps_order():
    tensors = [(f"t{i}", torch.zeros(n)) for i, n in enumerate([10, 10, 30, 5, 100])]
    buckets = list(bucketed(tensors, 100))  # 4 bytes per element
    assert [[n for n, _ in b] for b in buckets] == [["t0", "t1"], ["t2"], ["t3"], ["t4"]]


@contextmanager
def sender_process(target, *args):
    """Run target(port, *args, results) in a spawned process; yields (port, results) to the
    receiving side and checks the process ended cleanly."""
    ctx = mp.get_context("spawn")
    results = ctx.Queue()
    port = free_port()
    process = ctx.Process(target=target, args=(port, *args, results))
    process.start()
    try:
        yield port, results
    finally:
        process.join(timeout=60)
    assert process.exitcode == 0


def _send(port: int, version: int, tensors, results) -> None:
    sender = WeightSender("127.0.0.1", port, 2)
    for v in (version, version + 1):
        try:
            results.put(sender.send(v, bucketed(tensors, 40)))
        except WeightMismatch as e:
            results.put(str(e))
    sender.close()


def test_tensors_arrive_bit_exact_over_a_gloo_group_and_a_refusal_reaches_the_sender():
    tensors = named() + [(f"h{i}", torch.randn(3, 5).to(torch.float16)) for i in range(3)]
    tensors += [("bf", torch.randn(9).to(torch.bfloat16)), ("scalar", torch.tensor(1.5))]
    with sender_process(_send, 5, tensors) as (port, results):
        link = Link("gloo", "127.0.0.1", port, 1, 2)
        header = link.recv_header()
        assert header.version == 5 and len(header.buckets) > 1
        assert link.sum(0) == 0
        received = [pair for bucket in link.recv_buckets(header) for pair in bucket]
        assert [n for n, _ in received] == [n for n, _ in tensors]
        for (_, got), (_, sent) in zip(received, tensors, strict=True):
            assert got.dtype == sent.dtype and torch.equal(got, sent)
        assert results.get(timeout=60) == {n: checksum(t) for n, t in received}
        # second update: this receiver refuses, so no tensor follows and the sender says so
        assert link.recv_header().version == 6
        assert link.sum(1) == 1
        assert "refused by 1 receiver" in results.get(timeout=60)
        link.close()


STREAM_BUCKETS = 10
STREAM_ELEMENTS = 8 * 2**20  # 32 MiB of float32 per bucket


def _stream_tensor(i: int) -> torch.Tensor:
    return torch.full((STREAM_ELEMENTS,), float(i + 1))


def _status_kib(field: str) -> int:
    with open("/proc/self/status") as f:
        return next(int(line.split()[1]) for line in f if line.startswith(field + ":"))


def _reset_peak_rss() -> None:
    """Make VmHWM (the peak resident memory) the current resident memory (Linux >= 4.0)."""
    with open("/proc/self/clear_refs", "w") as f:
        f.write("5")


def _stream_send(port: int, results) -> None:
    """Send STREAM_BUCKETS one-tensor buckets made on demand (as the export's gathers make them);
    report the checksums and the peak resident memory the update added, in buckets."""
    def stream():
        for i in range(STREAM_BUCKETS):
            yield [(f"w{i}", _stream_tensor(i))]

    plan = [[(f"w{i}", torch.empty(STREAM_ELEMENTS, device="meta"))] for i in range(STREAM_BUCKETS)]
    sender = WeightSender("127.0.0.1", port, 2)
    _reset_peak_rss()
    before = _status_kib("VmRSS")
    sums = sender.send(3, stream(), plan=plan)
    extra = (_status_kib("VmHWM") - before) * 1024
    results.put((sums, extra / (STREAM_ELEMENTS * 4)))
    try:  # a stream that breaks its plan is an error on the sender, not a silent wrong update
        sender.send(4, iter([[("w0", torch.zeros(3))]]), plan=[[("w0", torch.empty(3, 2, device="meta"))]])
    except RuntimeError as e:
        results.put(str(e))
    sender.close()


def test_a_streamed_update_holds_about_two_buckets():
    """The bucket on the wire and the next one, gathered meanwhile; listing the stream first (the
    sender before streaming) would hold all ten."""
    with sender_process(_stream_send) as (port, results):
        link = Link("gloo", "127.0.0.1", port, 1, 2)
        header = link.recv_header()
        assert [[s.name for s in b] for b in header.buckets] == [[f"w{i}"] for i in range(STREAM_BUCKETS)]
        assert link.sum(0) == 0
        sums = {}
        for i, bucket in enumerate(link.recv_buckets(header)):
            ((name, t),) = bucket
            assert name == f"w{i}" and torch.equal(t, _stream_tensor(i))
            sums[name] = checksum(t)
        sent, extra_buckets = results.get(timeout=120)
        assert sent == sums
        assert extra_buckets < 3, f"the sender held {extra_buckets:.2f} buckets at its peak"
        assert link.recv_header().version == 4
        assert link.sum(0) == 0
        assert "bucket 0 of the weight stream differs from its plan" in results.get(timeout=60)
        link.close()

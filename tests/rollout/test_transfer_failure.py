"""A weight update whose group loses a member fails with WeightTransferError on both transports.

The NCCL link's decision logic (poll, deadline, abort, message) is `wait_until`, tested here with a
fake clock; vLLM's silently disabled communicator is built for real (it is disabled on a CPU torch);
the gloo link is a real group whose receiver dies mid-update. The CUDA tests check the pieces that
need a device: a real event polled, vLLM's stream switch undone, the async-error binding.
"""

from __future__ import annotations

import multiprocessing as mp
import os
import threading
import time
from types import SimpleNamespace

import pytest
import torch
from rollout_processes import free_port

from areal_hpc.rollout.weight_transfer import (
    Link,
    WeightSender,
    WeightTransferError,
    bucketed,
    check_communicator,
    kept_stream,
    nccl_async_error,
    nccl_load_error,
    rendezvous,
    wait_until,
)

WHAT = "weight group at h:1, rank 0 of 3: broadcast of 'w'"


class FakeClock:
    """A clock that advances only when slept on."""

    def __init__(self) -> None:
        self.now = 100.0
        self.sleeps = 0

    def __call__(self) -> float:
        return self.now

    def sleep(self, seconds: float) -> None:
        self.now += seconds
        self.sleeps += 1


def _wait(clock: FakeClock, done, error=lambda: None, timeout_s: float = 5.0, started: float | None = None) -> list[int]:
    """Run wait_until with one-second polls; returns the aborts it made (raises what it raises)."""
    aborts: list[int] = []
    wait_until(done, error, lambda: aborts.append(1), WHAT, timeout_s, clock.now if started is None else started,
               clock=clock, sleep=clock.sleep, poll_s=1.0)
    return aborts


def test_a_collective_that_ends_is_waited_for_without_an_abort():
    clock = FakeClock()
    polls = iter([False, False, True])
    assert _wait(clock, lambda: next(polls)) == []
    assert clock.sleeps == 2


def test_a_collective_past_its_deadline_is_aborted_and_named():
    clock = FakeClock()
    aborts: list[int] = []
    # queued 2 s before its wait began: the deadline counts from the queueing
    with pytest.raises(WeightTransferError) as e:
        wait_until(lambda: False, lambda: None, lambda: aborts.append(1), WHAT, 5.0, clock.now - 2,
                   clock=clock, sleep=clock.sleep, poll_s=1.0)
    assert aborts == [1] and clock.sleeps == 3
    assert str(e.value) == (f"{WHAT}: not done 5 s after it was queued (a member of the group died or hangs);"
                            " the communicator was aborted")


def test_an_async_error_aborts_at_once_and_is_quoted():
    clock = FakeClock()
    errors = iter([None, "NCCL reports remote process exited or there was a network error"])
    with pytest.raises(WeightTransferError, match=f"^{WHAT}: NCCL reports remote process exited .*; the communicator"
                                                  " was aborted$"):
        _wait(clock, lambda: False, lambda: next(errors), timeout_s=60)
    assert clock.sleeps == 1


def test_a_collective_ended_by_an_error_is_no_success():
    """NCCL's kernels may end on a failure with the data incomplete: the error is asked first."""
    with pytest.raises(WeightTransferError, match="NCCL reports unhandled system error"):
        _wait(FakeClock(), lambda: True, lambda: "NCCL reports unhandled system error")


def test_a_collective_that_ended_is_a_success_even_past_its_deadline():
    clock = FakeClock()
    assert _wait(clock, lambda: True, started=clock.now - 10) == []


def test_a_working_communicator_passes_the_check():
    def never() -> str:
        raise AssertionError("the library is asked only for a disabled communicator")

    check_communicator(SimpleNamespace(available=True, disabled=False, world_size=2), WHAT, False, never)


def test_a_communicator_disabled_by_the_environment_says_so():
    comm = SimpleNamespace(available=False, disabled=True, world_size=5)
    with pytest.raises(WeightTransferError, match="disabled: VLLM_DISABLE_PYNCCL is set$"):
        check_communicator(comm, WHAT, True, nccl_load_error)


@pytest.mark.skipif(torch.cuda.is_available(), reason="the NCCL library loads where CUDA is")
def test_vllms_communicator_without_an_nccl_library_is_an_error_not_a_silent_no_op():
    """vLLM's PyNcclCommunicator, built over a real two-member group, disables itself when NCCL does
    not load (here: a CPU torch) and its collectives then return without moving anything."""
    from vllm.distributed.device_communicators.pynccl import PyNcclCommunicator

    host, port = "127.0.0.1", free_port()
    comms = {}

    def member(rank: int) -> None:
        comms[rank] = PyNcclCommunicator(rendezvous(host, port, rank, 2, timeout_s=30), device=0)

    threads = [threading.Thread(target=member, args=(r,)) for r in (0, 1)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=60)
    comm = comms[1]
    received = torch.zeros(3)
    assert comm.broadcast(received, src=0) is None and torch.equal(received, torch.zeros(3))  # the silent no-op
    where = f"weight group at {host}:{port}, rank 1 of 2"
    with pytest.raises(WeightTransferError, match=f"^{where}: vLLM's NCCL communicator is disabled: the NCCL library"
                                                  r" did not load \(ValueError: NCCL only supports CUDA and ROCm"
                                                  r" backends.\); set VLLM_NCCL_SO_PATH"):
        check_communicator(comm, where, False, nccl_load_error)


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the CPU case")
def test_keeping_the_stream_touches_no_cuda_without_it():
    with kept_stream(torch.device("cpu")):
        pass
    assert not torch.cuda.is_initialized()


def _die_after_the_vote(port: int, results) -> None:
    link = Link("gloo", "127.0.0.1", port, 1, 2)
    results.put(link.recv_header().version)
    results.close()
    results.join_thread()  # flushed: os._exit ends the queue's feeder thread
    link.sum(0)
    os._exit(0)  # no close: as a killed generator


def test_a_receiver_dying_mid_update_fails_the_gloo_send_with_a_weight_transfer_error():
    ctx = mp.get_context("spawn")
    results = ctx.Queue()
    port = free_port()
    process = ctx.Process(target=_die_after_the_vote, args=(port, results))
    process.start()
    try:
        sender = WeightSender("127.0.0.1", port, 2, timeout_s=60)
        tensors = [(f"w{i}", torch.ones(2**22)) for i in range(4)]  # 16 MiB each, more than a socket buffers
        start = time.monotonic()
        with pytest.raises(WeightTransferError, match=rf"^weight group at 127.0.0.1:{port}, rank 0 of 2: broadcast"
                                                      r" of 'w\d': "):
            sender.send(1, bucketed(tensors, 2**24))
        assert time.monotonic() - start < 30  # the closed socket tells, not the 60 s timeout
        assert results.get(timeout=10) == 1
        sender.close()
    finally:
        process.join(timeout=60)


@pytest.mark.cuda
def test_a_real_cuda_event_is_polled_to_its_end_or_its_deadline():
    side = torch.cuda.Stream()
    with torch.cuda.stream(side):
        torch.cuda._sleep(2 * 10**9)  # about a second of GPU clock cycles
    done = torch.cuda.Event()
    done.record(side)
    aborts: list[int] = []
    with pytest.raises(WeightTransferError, match="not done 0.1 s after it was queued"):
        wait_until(done.query, lambda: None, lambda: aborts.append(1), WHAT, 0.1, time.monotonic())
    assert aborts == [1]
    wait_until(done.query, lambda: None, lambda: aborts.append(2), WHAT, 60, time.monotonic())
    assert done.query() and aborts == [1]


@pytest.mark.cuda
def test_keeping_the_stream_undoes_vllms_side_stream():
    """vLLM's current_stream() on a thread that never set a stream (as PyNccl's warm-up calls it)
    makes a new stream current; kept_stream puts the caller's back, for torch and for vLLM."""
    from vllm.utils.torch_utils import current_stream

    seen = {}

    def fresh_thread() -> None:
        seen["before"] = torch.cuda.current_stream().cuda_stream
        with kept_stream(torch.device("cuda")):
            current_stream()
            seen["inside"] = torch.cuda.current_stream().cuda_stream
        seen["after"] = torch.cuda.current_stream().cuda_stream
        seen["vllm_after"] = current_stream().cuda_stream

    thread = threading.Thread(target=fresh_thread)
    thread.start()
    thread.join(timeout=60)
    assert seen["inside"] != seen["before"]
    assert seen["after"] == seen["vllm_after"] == seen["before"]


@pytest.mark.cuda
def test_the_async_error_binding_reads_a_real_communicator():
    """ncclCommGetAsyncError, bound here (vLLM's wrapper does not), on a one-rank NCCL communicator."""
    from vllm.distributed.device_communicators.pynccl_wrapper import NCCLLibrary

    nccl = NCCLLibrary()
    torch.cuda.set_device(0)
    comm = SimpleNamespace(nccl=nccl, comm=nccl.ncclCommInitRank(1, nccl.ncclGetUniqueId(), 0), disabled=False)
    error = nccl_async_error(comm)
    try:
        assert error() is None
    finally:
        nccl.ncclCommAbort(comm.comm)
    comm.disabled = True
    assert error() == "the communicator was aborted"

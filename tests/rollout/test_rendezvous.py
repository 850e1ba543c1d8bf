"""A weight group's members wait for each other as long as the run's startup_timeout_s allows.

vLLM's NCCL helper bootstraps through a TCP store whose wait is fixed at 300 s, shorter than a
CUDA engine's start; weight_transfer.rendezvous makes that store with the caller's deadline. The
store is plain TCP, so its deadline is tested here on the CPU; so is the gloo link's.
"""

from __future__ import annotations

import threading
import time

import pytest

from areal_hpc.rollout.weight_transfer import Link, WeightSender, WeightTransferError, rendezvous
from areal_hpc.wire.network import free_port, node_address


def test_the_nccl_bootstrap_store_gives_up_at_the_callers_deadline() -> None:
    start = time.monotonic()
    host, port = node_address(), free_port()
    with pytest.raises(WeightTransferError, match=f"weight group at {host}:{port}, rank 0 of 2: Timed out"
                                                  ".* waiting for clients. 1/2 clients joined"):
        rendezvous(host, port, 0, 2, timeout_s=2)
    assert 2 <= time.monotonic() - start < 60


def test_the_nccl_bootstrap_store_waits_for_a_late_member() -> None:
    """A receiver joining after the sender (its engine still starting) is waited for."""
    host, port = node_address(), free_port()
    joined = {}

    def late_member() -> None:
        time.sleep(4)
        joined["receiver"] = rendezvous(host, port, 1, 2, timeout_s=30)

    thread = threading.Thread(target=late_member)
    thread.start()
    sender = rendezvous(host, port, 0, 2, timeout_s=30)
    thread.join(timeout=60)
    sender.broadcast_obj("unique id", src=0)
    assert joined["receiver"].broadcast_obj(None, src=0) == "unique id"


def test_a_gloo_sender_without_receivers_gives_up_at_its_deadline() -> None:
    start = time.monotonic()
    with pytest.raises(Exception, match="(?i)timeout|timed out"):
        WeightSender(node_address(), free_port(), 2, "gloo", timeout_s=2)
    assert 2 <= time.monotonic() - start < 60


def test_a_gloo_group_joins_over_the_node_address() -> None:
    """Both members meet at node_address(), not at the hostname's (loopback) address."""
    host, port = node_address(), free_port()
    links = {}

    def receiver() -> None:
        links[1] = Link("gloo", host, port, 1, 2, timeout_s=30)

    thread = threading.Thread(target=receiver)
    thread.start()
    links[0] = Link("gloo", host, port, 0, 2, timeout_s=30)
    thread.join(timeout=60)
    sums = {}
    threads = [threading.Thread(target=lambda r=r: sums.update({r: links[r].sum(r + 1)})) for r in (0, 1)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=60)
    assert sums == {0: 3, 1: 3}
    for link in links.values():
        link.close()

"""Addresses where process groups meet: this node's address and a free TCP port on it."""

from __future__ import annotations

import socket


def node_address() -> str:
    """An address of this node that the other nodes of the job can reach."""
    name = socket.gethostname()
    try:
        return socket.gethostbyname(name)
    except OSError:
        return "127.0.0.1"


def free_port() -> int:
    """A TCP port that was free a moment ago (the group's store binds it right after)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("", 0))
        return s.getsockname()[1]

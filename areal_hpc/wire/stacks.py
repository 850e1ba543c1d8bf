"""`kill -USR2 PID`: a rank, or its vLLM engine process, prints every thread's Python stack to
stderr and goes on. It shows where a hung rank waits without a debugger on the node; the tests
send it to every process of a job that ran past its timeout before they kill it."""

from __future__ import annotations

import faulthandler
import signal

STACKS_SIGNAL = signal.SIGUSR2


def dump_stacks_on_signal() -> None:
    faulthandler.register(STACKS_SIGNAL, all_threads=True, chain=False)

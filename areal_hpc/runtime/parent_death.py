"""Children of a rank die with it.

vLLM's engine core (and, on GPU, its workers) run in child processes of a generator rank. When the
rank is killed outright (kill -9, the out-of-memory killer), nothing tells them: they are adopted
by init and keep their memory, cores and GPU until the node is rebooted or, under SLURM, unless the
site tracks a step's processes by cgroup. Linux's parent-death signal closes that hole: the kernel
sends SIGKILL to the child the moment the thread that started it ends.
"""

from __future__ import annotations

import ctypes
import os
import signal

_PR_SET_PDEATHSIG = 1  # from <linux/prctl.h>


def die_with_parent() -> None:
    """Ask the kernel for SIGKILL when this process's parent ends; end now if it already has.

    Call it first thing in the child: the parent must outlive the thread that started the child
    (true of a rank's main thread, which starts vLLM's engine)."""
    parent = os.getppid()
    libc = ctypes.CDLL(None, use_errno=True)
    if libc.prctl(_PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0) != 0:
        raise OSError(ctypes.get_errno(), "prctl(PR_SET_PDEATHSIG) failed")
    if parent == 1 or os.getppid() != parent:  # the parent died before the request took effect
        os._exit(1)

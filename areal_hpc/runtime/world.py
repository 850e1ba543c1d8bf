"""One MPI rank from start to exit: rank 0 checks and plans, then every rank takes its role.

Order matters for clear failures: rank 0 loads the config, checks the MPI world size against it,
finds the model directory and loads the data before any process group exists; the other ranks
wait (sleeping, not spinning) for its LaunchPlan, or exit with code 2 on a Shutdown. With the
plan every worker connects its lifeline to rank 0, so a rank that dies without a word is named
(under srun, which gives the others SIGTERM before SIGKILL; mpiexec kills them at once and names
the process itself).
"""

from __future__ import annotations

import dataclasses
import gc
import logging
import os
import signal
import sys
import traceback

from areal_hpc.errors import UserError
from areal_hpc.metrics.library_logs import quiet_libraries
from areal_hpc.runtime.failure import abort_job, reason_of, worker_failed
from areal_hpc.runtime.stacks import dump_stacks_on_signal
from areal_hpc.wire.layout import Role, role_of
from areal_hpc.wire.lifeline import LifelineServer
from areal_hpc.wire.lifeline import hold as hold_lifeline
from areal_hpc.wire.messages import LaunchPlan, Shutdown
from areal_hpc.wire.network import node_address, socket_env
from areal_hpc.wire.transport import Channel

USER_ERROR_EXIT = 2


def _logging(level: str, rank: int, role: str) -> None:
    logging.basicConfig(
        level=level, format=f"%(asctime)s [rank {rank} {role}] %(name)s: %(message)s", force=True
    )
    if level != "DEBUG":
        quiet_libraries()


def _worker_signals() -> None:
    """SLURM may signal every rank before the time limit; only rank 0 acts on it (checkpoint, then
    Shutdown). A Python handler rather than SIG_IGN, so child processes keep the default action."""

    def note(signum: int, _frame) -> None:
        logging.getLogger(__name__).info("signal %d: rank 0 decides when to stop", signum)

    signal.signal(signal.SIGUSR1, note)
    signal.signal(signal.SIGTERM, note)


def _controller(chan: Channel, config: str, overrides: list[str]) -> int:
    from areal_hpc.runtime import fault
    from areal_hpc.runtime.preflight import preflight

    try:
        fault.check(Role.CONTROLLER, 0, "preflight")
        plan, prompts = preflight(config, overrides, chan.size)
        # Listens on cluster.network_interface: an interface missing here refuses the launch.
        lifelines = LifelineServer(range(1, chan.size), interface=plan.config.cluster.network_interface)
    except UserError as e:
        print(f"error: {e}", file=sys.stderr, flush=True)
        for rank in range(1, chan.size):
            chan.send(rank, Shutdown("the launch was refused"))
        chan.flush()
        return USER_ERROR_EXIT
    except BaseException as e:  # a bug, not bad input: the waiting ranks must not wait forever
        traceback.print_exc()
        abort_job(chan.comm, f"rank 0 ({Role.CONTROLLER}) failed before the launch: {reason_of(e)}")
        raise
    _logging(plan.config.logging.level, 0, Role.CONTROLLER)
    # The prompts and the config live for the whole run: keep them out of every full garbage
    # collection, whose cost would otherwise grow with the data set on rank 0's event loop.
    gc.freeze()
    plan = dataclasses.replace(plan, lifeline=lifelines.address, lifeline_secret=lifelines.secret)
    for rank in range(1, chan.size):
        chan.send(rank, plan)
    try:
        from areal_hpc.runtime.controller_rank import Controller

        return Controller(plan, prompts, chan, lifelines).run()
    except BaseException as e:
        traceback.print_exc()
        abort_job(chan.comm, f"rank 0 ({Role.CONTROLLER}) failed: {reason_of(e)}")
        raise


def _worker(chan: Channel) -> int:
    _worker_signals()
    _, msg = chan.recv(0)
    if isinstance(msg, Shutdown):
        return USER_ERROR_EXIT
    if not isinstance(msg, LaunchPlan):
        raise RuntimeError(f"rank {chan.rank}: expected the launch plan, got {msg!r:.200}")
    role, index = role_of(msg.config, chan.rank)
    _logging(msg.config.logging.level, chan.rank, f"{role} {index}")
    hold_lifeline(msg.lifeline, msg.lifeline_secret, chan.rank, lambda: chan.shutdown_seen)
    try:
        # Before any process group: gloo and NCCL read their interface when a group is made.
        interface = msg.config.cluster.network_interface
        os.environ.update(socket_env(interface, node_address(interface, toward=msg.lifeline[0]), os.environ))
        if role is Role.TRAINER:
            from areal_hpc.runtime import trainer_rank

            trainer_rank.run(msg, chan, index)
        else:
            from areal_hpc.runtime import generator_rank

            generator_rank.run(msg, chan, index)
    except BaseException as e:
        worker_failed(chan, role, index, e)
    return 0


def run(config: str, overrides: list[str]) -> int:
    """The whole life of this MPI rank; returns its exit code."""
    from mpi4py import MPI

    dump_stacks_on_signal()
    chan = Channel(MPI.COMM_WORLD)
    if chan.rank == 0:
        return _controller(chan, config, overrides)
    return _worker(chan)

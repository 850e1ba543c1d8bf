"""One MPI rank from start to exit: rank 0 checks and plans, then every rank takes its role.

Order matters for clear failures: rank 0 loads the config, checks the MPI world size against it,
finds the model directory and loads the data before any process group exists; the other ranks
wait (sleeping, not spinning) for its LaunchPlan, or exit with code 2 on a Shutdown. With the
plan every worker connects its lifeline to rank 0, so a rank that dies without a word is named
(plain mpiexec kills the others at once and names the process itself). Before that, a rank that
never reaches MPI_Init or never sends the plan is caught by the start timeout (wire/start_timeout.py).
After a rank died, every rank exits without MPI_Finalize, which would wait for it.
"""

from __future__ import annotations

import dataclasses
import gc
import json
import logging
import os
import signal
import sys
import time
import traceback
from pathlib import Path

from areal_hpc.errors import UserError
from areal_hpc.metrics.library_logs import quiet_libraries
from areal_hpc.runtime.failure import abort_job, reason_of, worker_failed
from areal_hpc.wire.layout import Role, role_of
from areal_hpc.wire.lifeline import LifelineServer
from areal_hpc.wire.lifeline import hold as hold_lifeline
from areal_hpc.wire.link import LinkChannel
from areal_hpc.wire.messages import LaunchPlan, Shutdown
from areal_hpc.wire.network import node_address, socket_env
from areal_hpc.wire.stacks import dump_stacks_on_signal
from areal_hpc.wire.start_timeout import START_TIMEOUT_ENV, start_deadline, start_timeout_s
from areal_hpc.wire.transport import Channel, Mailbox

USER_ERROR_EXIT = 2
# Where rank 0 writes its exit status for the SLURM script (see `_report_exit`).
EXIT_FILE_ENV = "AREAL_EXIT_FILE"


def _logging(level: str, who: str) -> None:
    logging.basicConfig(level=level, format=f"%(asctime)s [{who}] %(name)s: %(message)s", force=True)
    if level != "DEBUG":
        quiet_libraries()


def _worker_signals() -> None:
    """SLURM may signal every rank before the time limit; only rank 0 acts on it (checkpoint, then
    Shutdown). SIGTERM gets a Python handler rather than SIG_IGN, so child processes keep its
    default action. SIGUSR1 is ignored, by the rank's children too (the disposition is inherited):
    mpiexec -disable-auto-cleanup sends it to every rank's process group when a rank dies, and its
    default action would end the vLLM engine, the reward workers and Python's resource tracker."""

    def note(signum: int, _frame) -> None:
        logging.getLogger(__name__).info("signal %d: rank 0 decides when to stop", signum)

    signal.signal(signal.SIGUSR1, signal.SIG_IGN)
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
    _logging(plan.config.logging.level, f"rank 0 {Role.CONTROLLER}")
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


def _take_rank(chan: Mailbox, plan: LaunchPlan, rank: int) -> int:
    """Become worker `rank` of the plan: log as it and hold its lifeline; returns its role's index."""
    chan.rank = rank
    role, index = role_of(plan.config, rank)
    _logging(plan.config.logging.level, f"rank {rank} {role} {index}")
    hold_lifeline(plan.lifeline, plan.lifeline_secret, rank, lambda: chan.shutdown_seen)
    return index


def _socket_env(plan: LaunchPlan) -> None:
    """Before any process group: gloo and NCCL read their interface when a group is made."""
    interface = plan.config.cluster.network_interface
    os.environ.update(socket_env(interface, node_address(interface, toward=plan.lifeline[0]), os.environ))


def _worker(chan: Channel, start_timeout: float) -> int:
    _worker_signals()
    try:
        _, msg = chan.recv(0, timeout=start_timeout)
    except TimeoutError:
        print(f"error: rank {chan.rank}: no launch plan from rank 0 within {start_timeout:g} s"
              f" ({START_TIMEOUT_ENV}): rank 0 failed to start or died; ending this rank", file=sys.stderr, flush=True)
        _exit_without_finalize(1)  # MPI_Finalize would wait for rank 0
    if isinstance(msg, Shutdown):
        return USER_ERROR_EXIT
    if not isinstance(msg, LaunchPlan):
        raise RuntimeError(f"rank {chan.rank}: expected the launch plan, got {msg!r:.200}")
    index = _take_rank(chan, msg, chan.rank)
    role = role_of(msg.config, chan.rank)[0]
    try:
        _socket_env(msg)
        if role is Role.TRAINER:
            from areal_hpc.runtime import trainer_rank

            trainer_rank.run(msg, chan, index)
        else:
            from areal_hpc.runtime import generator_rank

            generator_rank.run(msg, chan, index)
    except BaseException as e:
        worker_failed(chan, role, index, e)
    return 0


def run_replacement(run_dir: str) -> int:
    """A replacement generator, outside the MPI world: reach the running job's rank 0 through
    RUN_DIR/join.json, take the launch plan, start an engine and a reward pool, wait as a spare
    until rank 0 offers a lost generator's rank, then be that generator. Exit 0 when the run
    ends, also before an offer came."""
    from areal_hpc.runtime.replacements import JOIN_FILE

    path = Path(run_dir) / JOIN_FILE
    try:
        info = json.loads(path.read_text())
        address = (str(info["address"][0]), int(info["address"][1]))
        secret = str(info["secret"])
    except FileNotFoundError:
        print(f"error: {path} not found: no run that takes replacements is running in {run_dir}"
              " (rollout.max_replacements = 0, or it ended)", file=sys.stderr, flush=True)
        return USER_ERROR_EXIT
    except (ValueError, KeyError, IndexError, TypeError) as e:
        print(f"error: {path} is not a join file of areal-hpc: {e}", file=sys.stderr, flush=True)
        return USER_ERROR_EXIT
    _worker_signals()
    dump_stacks_on_signal()
    try:
        chan = LinkChannel.connect(address, secret)
    except OSError as e:
        print(f"error: cannot reach rank 0 at {address[0]}:{address[1]} ({path}): {e}; the run has ended or"
              " its node is unreachable from here", file=sys.stderr, flush=True)
        return 1
    try:
        _, plan = chan.recv(0)
    except ConnectionError as e:
        print(f"spare: {e}", file=sys.stderr, flush=True)
        return 0
    if isinstance(plan, Shutdown):
        print(f"spare: not needed: {plan.reason}", file=sys.stderr, flush=True)
        return 0
    if not isinstance(plan, LaunchPlan):
        raise RuntimeError(f"spare: expected the launch plan, got {plan!r:.200}")
    _logging(plan.config.logging.level, "spare")
    logging.getLogger(__name__).info("joined the run in %s: starting an engine, then waiting for a generator's place",
                                     run_dir)
    from areal_hpc.runtime import generator_rank

    try:
        _socket_env(plan)
        generator_rank.run(plan, chan, None, lambda rank: _take_rank(chan, plan, rank))
    except BaseException as e:
        worker_failed(chan, Role.GENERATOR, role_of(plan.config, chan.rank)[1] if chan.rank > 0 else -1, e)
    return 0


def run_spare(config: str, overrides: list[str]) -> int:
    """A warm spare of the run `config` describes, as the SLURM scripts start them beside the
    ranks: wait until that run's rank 0 has written its join file (the one of this job, when
    AREAL_RUN_ID names it: a crashed run's file may still be there), then join as `--join` does."""
    from areal_hpc.config.load import load_config
    from areal_hpc.runtime.replacements import JOIN_FILE, RUN_ID_ENV

    try:
        cfg = load_config(config, overrides)
    except UserError as e:
        print(f"error: spare: {e}", file=sys.stderr, flush=True)
        return USER_ERROR_EXIT
    path, run_id = Path(cfg.logging.dir) / JOIN_FILE, os.environ.get(RUN_ID_ENV)
    deadline = time.monotonic() + cfg.startup_timeout_s
    while not _written_by(path, run_id):
        if time.monotonic() > deadline:
            print(f"error: spare: no {path} of run {run_id} within startup_timeout_s = {cfg.startup_timeout_s:g} s:"
                  " its rank 0 did not start", file=sys.stderr, flush=True)
            return 1
        time.sleep(1)
    return run_replacement(str(path.parent))


def _written_by(path: Path, run_id: str | None) -> bool:
    """Whether `path` is a join file of run `run_id` (of any run when None)."""
    try:
        return run_id is None or json.loads(path.read_text()).get("run") == run_id
    except (OSError, ValueError, AttributeError):  # not there yet, or being replaced
        return False


def run(config: str, overrides: list[str]) -> int:
    """The whole life of this MPI rank; returns its exit code."""
    try:
        start_timeout = start_timeout_s()
    except UserError as e:
        print(f"error: {e}", file=sys.stderr, flush=True)
        return USER_ERROR_EXIT
    with start_deadline(start_timeout):  # a rank that never reaches MPI_Init leaves the others in it
        from mpi4py import MPI

    dump_stacks_on_signal()
    chan = Channel(MPI.COMM_WORLD)
    if chan.rank == 0:
        code = _controller(chan, config, overrides)
        _report_exit(code)
    else:
        code = _worker(chan, start_timeout)
    if not chan.finalize:
        _exit_without_finalize(code)
    return code


def _report_exit(code: int) -> None:
    """Write rank 0's exit status where the SLURM script reads it (AREAL_EXIT_FILE, on the batch
    node where rank 0 runs): srun's status also carries that of a generator lost and survived, and
    a run that completed after a loss would be requeued as a crash. An abort writes nothing, and
    the script falls back to srun's status."""
    path = os.environ.get(EXIT_FILE_ENV)
    if path:
        try:
            Path(path).write_text(f"{code}\n")
        except OSError as e:  # e.g. in a container that does not see the batch node's /tmp
            logging.getLogger(__name__).warning("cannot write the exit status to %s (%s): %s", path, EXIT_FILE_ENV, e)


def _exit_without_finalize(code: int) -> None:
    """End this process now, without MPI_Finalize: with a rank of the world dead it waits for that
    rank forever (MPICH 5). Launch mpiexec with -disable-auto-cleanup so that the others outlive
    a lost rank at all."""
    logging.shutdown()
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)

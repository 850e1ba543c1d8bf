"""The batch fan-out under mpiexec: bytes that leave each rank's TCP sockets for one step's batch.

    UCX_TLS=tcp MPIR_CVAR_NOLOCAL=1 mpiexec -n 1+TP*PP*DP python benchmarks/fanout_ranks.py --tp 2 --pp 2 --dp 4

Rank 0 and TP*PP*DP trainer-like ranks (no model: the fan-out alone). MPICH is made to treat every
rank as remote (MPIR_CVAR_NOLOCAL) and UCX to carry everything over TCP, so all that a rank sends
leaves through its sockets, where the kernel counts it (TCP_INFO bytes_sent). Two ways, one step
each after a warm-up step:
- `forward` (before issue 14): rank 0 sends the whole batch to trainer 0, which sends it to every
  other trainer rank, as runtime/trainer_rank.py did;
- `shards` (now): rank 0's real TrainerCommands.batch (the batch plan, one share per replica root),
  each root the real broadcast in its replica (runtime/broadcast.py), as trainer_rank.run does.
Prints one JSON line: per mode the bytes each rank sent, and the largest over the batch's bytes
(its WholeBatch pickled, protocol 5).
"""

from __future__ import annotations

import argparse
import json
import os
import pickle
import socket
import struct
import time
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from areal_hpc.config import load_config
from areal_hpc.runtime.broadcast import broadcast, group_comm
from areal_hpc.runtime.trainer_commands import TrainerCommands
from areal_hpc.wire.layout import CONTROLLER_RANK, replica_ranks, trainer_ranks
from areal_hpc.wire.messages import PackedTrajectories, TrainShard, Trajectory
from areal_hpc.wire.transport import Channel

_TCPI_BYTES_SENT = 200  # offset of tcpi_bytes_sent in struct tcp_info (Linux >= 4.19)


@dataclass
class WholeBatch(PackedTrajectories):
    """The batch as one message, as rank 0 sent it before the fan-out (trainer 0 then forwarded
    it to every other trainer); also the measure of a batch's bytes."""

    version: int
    trajectories: list[Trajectory]


def tcp_bytes_sent() -> int:
    """Bytes this process's TCP sockets have sent, all of them together."""
    total = 0
    for fd in os.listdir("/proc/self/fd"):
        try:
            if not os.readlink(f"/proc/self/fd/{fd}").startswith("socket:"):
                continue
            sock = socket.socket(fileno=os.dup(int(fd)))
        except OSError:
            continue
        with sock:
            if sock.type == socket.SOCK_STREAM and sock.family in (socket.AF_INET, socket.AF_INET6):
                info = sock.getsockopt(socket.IPPROTO_TCP, socket.TCP_INFO, 256)
                total += struct.unpack_from("Q", info, _TCPI_BYTES_SENT)[0]
    return total


def synthetic_batch(trajectories: int, max_new: int, seed: int = 0) -> list[Trajectory]:
    """Groups of 16 samples of one prompt (64 to 1023 tokens), outputs log-normal around 0.3 x
    max_new and capped there, as benchmarks/packing.py's reasoning mixes (max_new 27,648: ~12k
    tokens a trajectory). Arrays of zeros: bytes do not depend on the values, and untouched
    zeros take no memory, so a paper-size batch fits anywhere. Each its own arrays, as each
    trajectory reaches rank 0 in its own message."""
    rng = np.random.default_rng(seed)
    out = []
    for i in range(trajectories):
        if i % 16 == 0:
            prompt = int(rng.integers(64, 1024))
        n = int(min(max_new, max(1, rng.lognormal(np.log(0.3 * max_new), 0.8))))
        out.append(Trajectory(i // 16, i % 16, np.zeros(prompt, np.int32), np.zeros(n, np.int32), np.zeros(n, np.float32),
                              np.zeros(n, np.int32), "stop", reward=float(rng.random() < 0.5)))
    return out


def measured(comm, step) -> int:
    """The bytes this rank's sockets sent during `step()`, which every rank calls together."""
    comm.Barrier()
    before = tcp_bytes_sent()
    step()
    comm.Barrier()
    time.sleep(0.3)  # let the kernel put the last segments on the wire
    return tcp_bytes_sent() - before


def main() -> None:
    parser = argparse.ArgumentParser()
    for name in ("tp", "pp", "dp"):
        parser.add_argument(f"--{name}", type=int, default=2)
    parser.add_argument("--trajectories", type=int, default=512)
    parser.add_argument("--max-new", type=int, default=4096)
    args = parser.parse_args()
    from mpi4py import MPI

    cfg = load_config(str(Path(__file__).parents[1] / "configs/experiments/tiny-cpu.yaml"), [
        f"trainer.tp={args.tp}", f"trainer.pp={args.pp}", f"trainer.dp={args.dp}", "ppo.minibatches=4"])
    world = MPI.COMM_WORLD
    chan = Channel(world)
    if chan.size != 1 + cfg.trainer_world:
        raise SystemExit(f"run with mpiexec -n {1 + cfg.trainer_world}")
    leader = trainer_ranks(cfg)[0]
    members = next((m for m in replica_ranks(cfg) if chan.rank in m), [])
    replica = group_comm(world, members) if members else None
    batch = synthetic_batch(args.trajectories, args.max_new) if chan.rank == CONTROLLER_RANK else None

    def forward() -> None:
        if chan.rank == CONTROLLER_RANK:
            chan.send(leader, WholeBatch(0, batch))
        elif chan.rank == leader:
            whole = chan.recv(CONTROLLER_RANK)[1]
            for r in trainer_ranks(cfg)[1:]:
                chan.send(r, whole)
            chan.flush(600)
        else:
            chan.recv(leader)
        chan.flush(600)

    def shards() -> None:
        if chan.rank == CONTROLLER_RANK:
            TrainerCommands(chan, cfg).batch(0, batch)
        else:
            root = chan.rank == members[0]
            shard = broadcast(replica, chan.recv(CONTROLLER_RANK)[1] if root else None)
            assert isinstance(shard, TrainShard) and shard.replica == replica_ranks(cfg).index(members)
        chan.flush(600)

    report = {"tp": args.tp, "pp": args.pp, "dp": args.dp, "ranks": chan.size, "trajectories": args.trajectories}
    for name, step in (("forward", forward), ("shards", shards)):
        measured(world, step)  # warm-up: connections and buffers
        sent = world.gather(measured(world, step), root=CONTROLLER_RANK)
        if chan.rank == CONTROLLER_RANK:
            report[name] = {"sent": sent}
    if chan.rank == CONTROLLER_RANK:
        batch_bytes = len(pickle.dumps(WholeBatch(0, batch), protocol=5))
        report["batch_bytes"] = batch_bytes
        report["tokens"] = sum(t.num_tokens for t in batch)
        for name in ("forward", "shards"):
            report[name]["max_rank"] = max(range(chan.size), key=lambda r: report[name]["sent"][r])  # noqa: B023
            report[name]["ratio"] = max(report[name]["sent"]) / batch_bytes
        print(json.dumps(report), flush=True)


if __name__ == "__main__":
    main()

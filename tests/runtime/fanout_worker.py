"""The trainer fan-out alone under mpiexec: rank 0 + the trainer ranks of a tp=2, dp=2 layout.

    mpiexec -n 5 python tests/runtime/fanout_worker.py OUT.json

Rank 0 sends one batch and two commands through TrainerCommands; each trainer rank takes them as
trainer_rank.run does (its replica's root from rank 0, the rest by the replica's broadcast) and
reports what it got. Rank 0 writes every report, and where it sent, to OUT.json.
"""

from __future__ import annotations

import json
import sys

from mpi4py import MPI

from areal_hpc.config import load_config
from areal_hpc.runtime.broadcast import broadcast, group_comm
from areal_hpc.runtime.trainer_commands import TrainerCommands
from areal_hpc.wire.layout import replica_ranks
from areal_hpc.wire.messages import Shutdown, TrainShard, Trajectory, UpdateWeights
from areal_hpc.wire.transport import Channel

CFG = load_config("configs/experiments/tiny-cpu.yaml", ["trainer.tp=2", "trainer.dp=2", "ppo.minibatches=2"])


class CountingChannel(Channel):
    def __init__(self, comm) -> None:
        super().__init__(comm)
        self.sent_to: list[int] = []

    def send(self, dest: int, msg: object) -> None:
        self.sent_to.append(dest)
        super().send(dest, msg)


def batch() -> list[Trajectory]:
    return [Trajectory(p, s, [1, 2, 3], [4] * (1 + (7 * p + s) % 13), [0.0] * (1 + (7 * p + s) % 13),
                       [0] * (1 + (7 * p + s) % 13), "stop", reward=float(s % 2)) for p in range(4) for s in range(4)]


def trainer(chan: Channel) -> dict:
    members = next(m for m in replica_ranks(CFG) if chan.rank in m)
    comm = group_comm(chan.comm, members)
    root = chan.rank == members[0]
    got = []
    while True:
        msg = broadcast(comm, chan.recv(0)[1] if root else None)
        if isinstance(msg, TrainShard):
            got.append({"type": "TrainShard", "replica": msg.replica, "advantages": msg.advantages,
                        "samples": [[t.prompt_id, t.sample_index] for t in msg.trajectories]})
        else:
            got.append({"type": type(msg).__name__})
        if isinstance(msg, Shutdown):
            return {"rank": chan.rank, "got": got}


def main() -> None:
    chan = CountingChannel(MPI.COMM_WORLD)
    if chan.rank:
        chan.send(0, trainer(chan))
        chan.flush()
        return
    commands = TrainerCommands(chan, CFG)
    commands.batch(0, batch())
    commands.command(UpdateWeights(1, ()))
    commands.command(Shutdown())
    sent_to = list(chan.sent_to)
    reports = [chan.recv(r)[1] for r in range(1, chan.size)]
    with open(sys.argv[1], "w") as f:
        json.dump({"sent_to": sent_to, "reports": reports}, f)


if __name__ == "__main__":
    main()

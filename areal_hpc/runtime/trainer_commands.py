"""Rank 0's one way to the trainer ranks: a message to each data-parallel replica's root.

Each root broadcasts what it gets within its replica (runtime/trainer_rank.py), so no trainer rank
forwards to all the others. A batch is cut on rank 0 (trainer/batch_plan.py) and each replica is
sent only its share: rank 0 sends the batch's bytes once in all, a root sends its share a few times
(the broadcast tree's fan-out), whatever the number of trainers.
"""

from __future__ import annotations

from areal_hpc.config.schema import ExperimentConfig
from areal_hpc.trainer.batch_plan import shards
from areal_hpc.wire.layout import replica_ranks
from areal_hpc.wire.messages import Trajectory
from areal_hpc.wire.transport import Channel


class TrainerCommands:
    def __init__(self, chan: Channel, cfg: ExperimentConfig) -> None:
        self.chan, self.cfg = chan, cfg
        self.roots = [ranks[0] for ranks in replica_ranks(cfg)]

    def command(self, msg: object) -> None:
        """UpdateWeights, SaveCheckpoint or Shutdown to every trainer rank."""
        for root in self.roots:
            self.chan.send(root, msg)

    def batch(self, version: int, trajectories: list[Trajectory]) -> None:
        """Train the policy at `version` on `trajectories`: each replica its TrainShard."""
        for shard in shards(self.cfg, version, trajectories):
            self.chan.send(self.roots[shard.replica], shard)

"""How one step's batch is cut across the trainer: advantages, PPO minibatches, data-parallel shares.

Pure and cheap (no torch): rank 0 plans the batch and sends each data-parallel replica only its
share (runtime/trainer_commands.py), so no trainer rank receives or forwards the whole batch.
1. advantages over the whole batch (trainer/advantages.py): group normalisation needs every sample
   of a prompt, so they are computed before the batch is cut;
2. cfg.ppo.minibatches token-balanced minibatches, each cut into trainer.dp token-balanced shares
   (trainer/packing.py split_balanced, by the tokens the model reads);
3. per replica, one TrainShard: its trajectories in batch order with their advantages, its part of
   each minibatch, and the whole batch's facts that the step's metrics need.
"""

from __future__ import annotations

from dataclasses import dataclass

from areal_hpc.config.schema import ExperimentConfig
from areal_hpc.trainer.advantages import compute_advantages
from areal_hpc.trainer.errors import BatchError
from areal_hpc.trainer.packing import split_balanced
from areal_hpc.wire.messages import TrainShard, Trajectory


def model_tokens(t: Trajectory) -> int:
    """Tokens the model reads for `t` (trainer/microbatch.py TokenSequence.length): the prompt and
    every output token but the last, which is only a label."""
    return len(t.prompt_ids) + len(t.output_ids) - 1


def dp_split(lengths: list[int], dp: int) -> list[list[int]]:
    """Token-balanced parts of the sequences of `lengths`, one per data-parallel replica."""
    if len(lengths) < dp:
        raise BatchError(f"{len(lengths)} sequences cannot be split across trainer.dp = {dp} ranks")
    return split_balanced(lengths, dp)


@dataclass(frozen=True)
class BatchPlan:
    """A batch's cut, by index into the batch."""

    # One per trajectory, over the whole batch.
    advantages: list[float]
    # shares[replica][minibatch]: ascending batch indices.
    shares: list[list[list[int]]]
    # Tokens the model reads, whole batch.
    tokens: int

    @property
    def advantage_mean(self) -> float:
        return sum(self.advantages) / len(self.advantages)


def plan(cfg: ExperimentConfig, lengths: list[int], rewards: list[float], prompt_ids: list[int],
         output_lengths: list[int]) -> BatchPlan:
    """The cut of a batch given per trajectory: tokens the model reads, reward, prompt id and
    output tokens (the "global" advantage weights)."""
    ppo, dp = cfg.ppo, cfg.trainer.dp
    if len(lengths) < ppo.minibatches:
        raise BatchError(f"{len(lengths)} trajectories cannot fill ppo.minibatches = {ppo.minibatches}")
    advantages = compute_advantages(rewards, prompt_ids, output_lengths, ppo.adv_norm)
    shares: list[list[list[int]]] = [[] for _ in range(dp)]
    for members in split_balanced(lengths, ppo.minibatches):
        for replica, part in enumerate(dp_split([lengths[i] for i in members], dp)):
            shares[replica].append([members[j] for j in part])
    return BatchPlan(advantages, shares, sum(lengths))


def shards(cfg: ExperimentConfig, version: int, trajectories: list[Trajectory]) -> list[TrainShard]:
    """One TrainShard per data-parallel replica, in replica order."""
    p = plan(cfg, [model_tokens(t) for t in trajectories], [t.reward for t in trajectories],
             [t.prompt_id for t in trajectories], [len(t.output_ids) for t in trajectories])
    out = []
    for replica, minibatches in enumerate(p.shares):
        # Batch order within the shard: the trainer packs micro-batches from the order it is given,
        # so this keeps them what they were when every rank cut the whole batch itself.
        members = sorted(i for mb in minibatches for i in mb)
        local = {i: k for k, i in enumerate(members)}
        out.append(TrainShard(
            version=version, replica=replica, trajectories=[trajectories[i] for i in members],
            advantages=[p.advantages[i] for i in members], minibatches=[[local[i] for i in mb] for mb in minibatches],
            batch_tokens=p.tokens, batch_trajectories=len(trajectories), advantage_mean=p.advantage_mean,
        ))
    return out

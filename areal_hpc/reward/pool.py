"""The asynchronous reward pool: `await pool.score(task)` from the generator's event loop.

Scoring runs in `reward.workers` separate processes (`python -m areal_hpc.reward.worker`, which
this module does not import, so it runs cleanly as __main__): a slow check never blocks the event
loop and a crash takes down one worker, not the generator.
Tasks wait in a bounded queue: when `reward.max_pending` tasks are queued, `score` waits
(backpressure on the generator). A worker that does not answer within the task's limit is killed
and restarted and the task fails with a reason; a worker that dies under a task is restarted and
the task resubmitted up to `reward.retries` times. Either way the pool keeps serving.
A program is run once per prompt's tests: samples whose responses hold the same program (a
group's samples often do once the policy is sure of itself) share one verdict, which is a
function of the program, the tests and the limits alone.
"""

from __future__ import annotations

import asyncio
import dataclasses
import json
import logging
import os
import sys
import weakref
from contextlib import suppress

from areal_hpc.config.schema import RewardConfig
from areal_hpc.reward.code_extract import extract_code
from areal_hpc.reward.code_tests import TestSuite
from areal_hpc.reward.sandbox import SandboxUnavailable
from areal_hpc.reward.task import CodeTask, CustomTask, MathTask, Task, Verdict, failure, task_to_json

log = logging.getLogger(__name__)

# Seconds a worker gets beyond the task's own limit (start-up of the sandbox, cleanup, transfer).
GRACE_S = 5.0
# Seconds a new worker gets to import its libraries and find its sandbox.
START_TIMEOUT_S = 120.0
# Longest protocol line accepted from a worker.
LINE_LIMIT = 1 << 20


class WorkerDied(Exception):
    """The worker process exited or closed its pipe."""


class _Worker:
    """One worker process and its pipes; one request at a time."""

    def __init__(self, proc: asyncio.subprocess.Process) -> None:
        self.proc = proc
        self.next_id = 0

    @classmethod
    async def start(cls, config: RewardConfig) -> tuple[_Worker, str]:
        proc = await asyncio.create_subprocess_exec(
            sys.executable, "-m", "areal_hpc.reward.worker", str(os.getpid()),
            stdin=asyncio.subprocess.PIPE, stdout=asyncio.subprocess.PIPE, limit=LINE_LIMIT,
        )
        worker = cls(proc)
        try:
            await worker._send({"config": dataclasses.asdict(config)})
            reply = await asyncio.wait_for(worker._receive(), START_TIMEOUT_S)
        except BaseException:
            await worker.kill()
            raise
        if "fatal" in reply:
            await worker.kill()
            raise SandboxUnavailable(str(reply["fatal"]))
        return worker, str(reply.get("ready"))

    async def _send(self, obj: dict) -> None:
        try:
            self.proc.stdin.write(json.dumps(obj).encode() + b"\n")
            await self.proc.stdin.drain()
        except (BrokenPipeError, ConnectionResetError) as e:
            raise WorkerDied(f"pipe closed: {e}") from None

    async def _receive(self) -> dict:
        try:
            line = await self.proc.stdout.readline()
        except (ValueError, asyncio.LimitOverrunError) as e:
            raise WorkerDied(f"unreadable reply: {e}") from None
        if not line:
            code = await self.proc.wait()
            raise WorkerDied(f"exit status {code}")
        try:
            reply = json.loads(line)
        except json.JSONDecodeError:
            raise WorkerDied(f"malformed reply {line[:80]!r}") from None
        if not isinstance(reply, dict):
            raise WorkerDied(f"malformed reply {line[:80]!r}")
        return reply

    async def score(self, task: Task) -> Verdict:
        self.next_id += 1
        await self._send({"id": self.next_id, "task": task_to_json(task)})
        reply = await self._receive()
        if reply.get("id") != self.next_id:
            raise WorkerDied(f"reply {reply.get('id')} to request {self.next_id}")
        try:
            return Verdict.from_json(reply["verdict"])
        except (KeyError, TypeError, ValueError) as e:
            raise WorkerDied(f"malformed verdict: {e}") from None

    async def kill(self) -> None:
        with suppress(ProcessLookupError):
            self.proc.kill()
        await self.proc.wait()

    async def stop(self, timeout: float = 5.0) -> None:
        """Close its input (it exits at end of input), then kill it if it lingers."""
        if self.proc.returncode is None:
            self.proc.stdin.close()
            with suppress(TimeoutError):
                await asyncio.wait_for(self.proc.wait(), timeout)
        await self.kill()


class RewardPool:
    """Worker processes scoring math, code and custom-function tasks for one generator."""

    def __init__(self, config: RewardConfig, grace_s: float = GRACE_S) -> None:
        self.config = config
        self.grace_s = grace_s
        self.backend = ""  # what the workers reported at start (the sandbox for code)
        self.restarts = 0
        self.timeouts = 0
        self._workers: list[_Worker | None] = [None] * config.workers
        self._queue: asyncio.Queue[tuple[Task, asyncio.Future]] | None = None
        self._drivers: list[asyncio.Task] = []
        # id of a prompt's tests -> program -> its verdict's future. Dropped when the tests object is
        # (the generator holds it while the prompt's samples are scored), so it stays small.
        self._programs: dict[int, dict[str, asyncio.Future]] = {}
        self.shared = 0  # verdicts given to a sample from an identical program's run

    async def start(self) -> RewardPool:
        """Start every worker; raises SandboxUnavailable if code scoring cannot run here (or the
        custom reward function does not import here: the worker's message says which)."""
        started = await asyncio.gather(*(_Worker.start(self.config) for _ in self._workers),
                                       return_exceptions=True)
        failure = next((s for s in started if isinstance(s, BaseException)), None)
        if failure is not None:
            await asyncio.gather(*(s[0].kill() for s in started if not isinstance(s, BaseException)))
            raise failure
        self._workers = [w for w, _ in started]
        self.backend = started[0][1]
        # Said once, so a run's log shows how model-written programs were isolated.
        cap = f"{self.config.memory_mb} MB" if self.config.memory_mb else "no cap"
        log.info("reward service: %d worker(s) scoring with %s; worker memory %s (reward.memory_mb)",
                 len(self._workers), self.backend, cap)
        self._queue = asyncio.Queue(self.config.max_pending)
        self._drivers = [asyncio.create_task(self._drive(i)) for i in range(len(self._workers))]
        return self

    async def __aenter__(self) -> RewardPool:
        return await self.start()

    async def __aexit__(self, *exc) -> None:
        await self.close()

    def worker_pids(self) -> list[int | None]:
        return [w.proc.pid if w is not None else None for w in self._workers]

    def pending(self) -> int:
        """Tasks queued for a worker (at most reward.max_pending)."""
        return self._queue.qsize() if self._queue is not None else 0

    async def score(self, task: Task) -> Verdict:
        """The verdict of one task; waits while the queue is full. A code task whose program was
        already run on the same tests gets that run's verdict (a failure of the service is not kept)."""
        if self._queue is None:
            raise RuntimeError("RewardPool.score called before start()")
        if not isinstance(task, CodeTask):
            return await self._queued(task)
        programs = self._programs_of(task.tests)
        program = extract_code(task.response)
        shared = programs.get(program)
        if shared is not None:
            try:
                verdict = await asyncio.shield(shared)
            except asyncio.CancelledError:
                if not shared.cancelled():
                    raise  # this caller was cancelled
            else:  # (else the sample that ran it gave up: this one runs it)
                self.shared += 1
                return verdict
        future = asyncio.get_running_loop().create_future()
        programs[program] = future
        try:
            return await self._queued(task, future)
        finally:
            # The service failed, not the program, or its caller gave up: the next copy runs again.
            if programs.get(program) is future and (future.cancelled() or not future.done()
                                                    or future.result().infra):
                del programs[program]

    async def _queued(self, task: Task, future: asyncio.Future | None = None) -> Verdict:
        future = future or asyncio.get_running_loop().create_future()
        await self._queue.put((task, future))
        return await future

    def _programs_of(self, tests: TestSuite) -> dict[str, asyncio.Future]:
        key = id(tests)
        if key not in self._programs:
            self._programs[key] = {}
            weakref.finalize(tests, self._programs.pop, key, None)
        return self._programs[key]

    async def close(self) -> None:
        for driver in self._drivers:
            driver.cancel()
        await asyncio.gather(*self._drivers, return_exceptions=True)
        self._drivers = []
        if self._queue is not None:
            while not self._queue.empty():
                self._queue.get_nowait()[1].cancel()
        await asyncio.gather(*(w.stop() for w in self._workers if w is not None))
        self._workers = [None] * len(self._workers)

    def _limit_s(self, task: Task) -> float:
        code = not isinstance(task, MathTask | CustomTask)
        own = self.config.code.total_timeout_s if code else self.config.timeout_s
        return own + self.grace_s

    def _failure(self, task: Task, reason: str) -> Verdict:
        return failure(task, self.config.wrong, reason, infra=True)

    def _under(self, task: Task) -> str:
        """What ran when a worker died or hung: the user's function for a custom task, named."""
        return f"custom reward function {self.config.function}: " if isinstance(task, CustomTask) else ""

    async def _drive(self, slot: int) -> None:
        """Feed one worker from the queue, forever."""
        assert self._queue is not None
        while True:
            task, future = await self._queue.get()
            if future.done():  # the caller gave up
                continue
            try:
                verdict = await self._score_on(slot, task)
            except asyncio.CancelledError:  # close(): the caller must not wait forever
                future.cancel()
                raise
            except Exception as e:  # a bug here must not silence this worker's slot for good
                log.exception("reward pool: scoring on worker %d failed", slot)
                verdict = self._failure(task, f"reward pool error: {type(e).__name__}: {e}")
            if not future.done():
                future.set_result(verdict)

    async def _score_on(self, slot: int, task: Task) -> Verdict:
        deaths = 0
        while True:
            worker = self._workers[slot]
            if worker is None:
                try:
                    worker, _ = await _Worker.start(self.config)
                except (TimeoutError, WorkerDied, SandboxUnavailable, OSError) as e:
                    log.error("reward worker %d could not restart: %s", slot, e)
                    return self._failure(task, f"reward worker could not start: {e}")
                self._workers[slot] = worker
                self.restarts += 1
            limit = self._limit_s(task)
            try:
                return await asyncio.wait_for(worker.score(task), limit)
            except TimeoutError:
                self.timeouts += 1
                self._workers[slot] = None
                await worker.kill()
                return self._failure(task, f"{self._under(task)}scoring timed out after {limit:g} s (worker restarted)")
            except WorkerDied as e:
                self._workers[slot] = None
                await worker.kill()
                deaths += 1
                log.warning("reward worker %d died under a task (%s%s)", slot, self._under(task), e)
                if deaths > self.config.retries:
                    return self._failure(task, f"{self._under(task)}the reward worker died under this task,"
                                               f" {deaths}x ({e})")

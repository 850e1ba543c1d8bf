"""One generator: a vLLM AsyncLLM engine that samples trajectories and takes new weights mid-flight.

Each sample of a request runs as its own engine request and asyncio task, so samples finish in any
order and one failing sample fails alone. Every output token keeps its log-probability and the
policy version of the weights that sampled it; vLLM's engine core labels each step's output with
the weight version it ran under, so the labels are exact in every interrupt mode.

Weight updates (`update_weights`) pause the engine according to the interrupt mode:
- "abort" (the paper's): in-flight requests stop and return what they generated; each is then
  resubmitted as prompt + generated prefix with the remaining token budget, so its KV cache is
  recomputed under the new weights. The caller still sees one trajectory per sample.
- "keep": requests stay in the engine and continue on the new weights with their old KV cache.
  Prefix caching is off in this mode, or new requests would reuse KV blocks of old weights.
- "wait": the non-interruptible baseline for benchmarks: the update waits until every in-flight
  request has finished. Configs may only choose "abort" or "keep".

The engine's arguments and environment come from rollout/engine_args.py, shared by every engine.

No mpi4py import here or in anything this imports: vLLM's engine core re-imports the main module in
a child process, which must not initialise MPI.
"""

from __future__ import annotations

import asyncio
import itertools
import os
import time
from collections.abc import Awaitable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TypeVar

import numpy as np

from areal_hpc.config.schema import ExperimentConfig
from areal_hpc.errors import UserError
from areal_hpc.rollout.engine_args import apply_env, engine_setup
from areal_hpc.rollout.engine_stats import EngineStats, stat_logger_factory
from areal_hpc.rollout.weight_transfer import WeightMismatch, WeightTransferError
from areal_hpc.wire.device import device_of
from areal_hpc.wire.messages import GenerateRequest, SamplingParams, Trajectory

T = TypeVar("T")
INTERRUPT_MODES = ("abort", "keep", "wait")
# Seconds between two looks at whether the engine core is alive while a call to it is in flight.
ENGINE_ALIVE_POLL_S = 0.2


class InvalidRequest(UserError):
    """A generation request the engine cannot serve (empty prompt, unknown token, bad sampling)."""


class PromptTooLong(InvalidRequest):
    """A prompt that leaves no room in the model's context for even one generated token."""


class SampleFailed(RuntimeError):
    """The engine failed one sample; the generator keeps serving the others."""

    def __init__(self, prompt_id: int, sample_index: int, reason: str) -> None:
        super().__init__(f"prompt {prompt_id} sample {sample_index}: {reason}")
        self.prompt_id = prompt_id
        self.sample_index = sample_index


@dataclass
class WeightUpdate:
    """Outcome of one weight update: for the controller's WeightsLoaded message."""

    version: int
    # Pause to resume, seconds.
    seconds: float
    # Tensor name -> weight_transfer.checksum of the tensor the workers received and loaded.
    checksums: dict[str, str]


# vLLM's CPU backend binds an engine's worker threads to the cores this variable names.
CPU_BIND_ENV = "VLLM_CPU_OMP_THREADS_BIND"


def cpu_bind_for(index: int | None) -> str | None:
    """The binding (VLLM_CPU_OMP_THREADS_BIND) for the engine of generator `index` on a CPU node:
    one engine per core in turn.

    Left to itself, vLLM binds every CPU engine of a node to the same core (measured: three
    engines' worker threads all on core 0, so their weight updates ran one after another). A spare
    (index None) is left unbound: the core it will serve on is the lost generator's, unknown while
    its engine starts, and bound to another generator's core (on 2 cores: generator 0's) it made 0
    to 3 samples in 3 steps; unbound, 32 to 36. None when the user chose the binding."""
    if CPU_BIND_ENV in os.environ:
        return None
    if index is None:
        return "nobind"
    cores = sorted(os.sched_getaffinity(0))
    return str(cores[index % len(cores)])


class Generator:
    """Owns one AsyncLLM engine loaded from a Hugging Face directory; use from one event loop.

    `cpu_bind`: in the CPU profile, how the engine's worker threads are bound to cores (see
    `cpu_bind_for`); None leaves the binding to vLLM."""

    def __init__(
        self, cfg: ExperimentConfig, model_dir: str | Path, version: int = 0, cpu_bind: str | None = None
    ) -> None:
        mode = cfg.generator.interrupt_mode
        if mode not in INTERRUPT_MODES:
            raise UserError(f"generator.interrupt_mode = {mode!r}: must be one of {INTERRUPT_MODES}")
        self.cfg = cfg
        self.model_dir = str(model_dir)
        self.mode = mode
        self.device = device_of(cfg)
        self.cpu_bind = cpu_bind
        self._version = version
        self._engine = None
        self._ids = itertools.count()
        self._tasks: set[asyncio.Task] = set()
        self._done: asyncio.Queue[Trajectory | SampleFailed] = asyncio.Queue()
        self._pending = 0
        # Cleared while weights change: (re)submissions wait for it.
        self._serving = asyncio.Event()
        self._update_lock = asyncio.Lock()
        self._max_model_len = 0
        self._vocab_size = 0
        # Step times by batch size, for the simulator's fit (engine_stats.py).
        self.engine_stats = EngineStats()

    @property
    def version(self) -> int:
        """The policy version of the weights the engine serves now."""
        return self._version

    @property
    def pending(self) -> int:
        """Samples submitted and not yet returned by `finished`."""
        return self._pending

    async def start(self) -> None:
        """Start the engine with the weights of `model_dir`; blocks the event loop meanwhile (~25 s on CPU)."""
        setup = engine_setup(self.cfg, self.device)
        apply_env(setup.env)  # before vLLM reads it: the engine core must start by spawn
        from vllm.engine.arg_utils import AsyncEngineArgs
        from vllm.v1.engine.async_llm import AsyncLLM

        args = AsyncEngineArgs(model=self.model_dir, tokenizer=self.cfg.model.tokenizer_path or self.model_dir,
                               **setup.kwargs)
        bind = self.device == "cpu" and self.cpu_bind is not None
        if bind:  # read by the engine processes started now; restored for the next engine
            os.environ[CPU_BIND_ENV] = self.cpu_bind
        try:
            self._engine = AsyncLLM.from_engine_args(args, stat_loggers=[stat_logger_factory(self.engine_stats)])
        finally:
            if bind:
                del os.environ[CPU_BIND_ENV]
        await self._engine.update_weight_version(str(self._version))
        self._max_model_len = self._engine.model_config.max_model_len
        self._vocab_size = self._engine.model_config.get_vocab_size()
        self._serving.set()

    async def _call(self, call: Awaitable[T]) -> T:
        """`call` to the engine, or vLLM's EngineDeadError once its engine core is dead: vLLM
        answers a control call in flight (pause, a weight update, an RPC) from the core's replies
        and leaves it waiting forever when the core dies, so a generator in a weight update would
        hang instead of failing, and the whole update would break for the others."""
        task = asyncio.ensure_future(call)
        while True:
            done, _ = await asyncio.wait({task}, timeout=ENGINE_ALIVE_POLL_S)
            if done:
                return task.result()
            if self._engine.errored:
                task.cancel()
                raise self._engine.dead_error

    def submit(self, request: GenerateRequest) -> None:
        """Queue `request.group_size` samples; returns at once. Bad requests raise here."""
        if self._engine is None:
            raise RuntimeError("Generator.submit before start()")
        self._check(request)
        submitted = time.monotonic()
        for index in range(request.group_size):
            task = asyncio.get_running_loop().create_task(self._sample(request, index, submitted))
            self._tasks.add(task)
            task.add_done_callback(self._tasks.discard)
        self._pending += request.group_size

    async def finished(self) -> Trajectory:
        """The next finished sample, in completion order; raises SampleFailed for a failed one."""
        item = await self._done.get()
        self._pending -= 1
        if isinstance(item, SampleFailed):
            raise item
        return item

    def _check(self, request: GenerateRequest) -> None:
        p, s = request.prompt_ids, request.sampling
        where = f"request for prompt {request.prompt_id}"
        if len(p) == 0:
            raise InvalidRequest(f"{where}: the prompt is empty")
        if len(p) >= self._max_model_len:
            raise PromptTooLong(
                f"{where}: the prompt has {len(p)} tokens but the model's context is {self._max_model_len}, "
                "which leaves no room to generate"
            )
        bad = p[(p < 0) | (p >= self._vocab_size)]
        if len(bad):
            raise InvalidRequest(f"{where}: token id {bad[0]} is outside the vocabulary [0, {self._vocab_size})")
        if request.group_size < 1:
            raise InvalidRequest(f"{where}: group_size = {request.group_size}, must be >= 1")
        if s.max_new_tokens < 1:
            raise InvalidRequest(f"{where}: max_new_tokens = {s.max_new_tokens}, must be >= 1")
        if s.temperature < 0 or not 0 < s.top_p <= 1 or s.top_k < -1:
            raise InvalidRequest(
                f"{where}: sampling temperature={s.temperature}, top_p={s.top_p}, top_k={s.top_k}: need "
                "temperature >= 0, 0 < top_p <= 1, top_k >= 1 or -1 (off)"
            )

    def _params(self, s: SamplingParams, index: int, attempt: int, max_tokens: int):
        from vllm import SamplingParams as VllmSamplingParams
        from vllm.sampling_params import RequestOutputKind

        return VllmSamplingParams(
            max_tokens=max_tokens,
            temperature=s.temperature,
            top_p=s.top_p,
            top_k=max(s.top_k, 0),
            # Samples of a group differ; a resubmission does not replay its first attempt.
            seed=None if s.seed is None else hash((s.seed, index, attempt)) % 2**31,
            logprobs=0,
            output_kind=RequestOutputKind.FINAL_ONLY,
        )

    async def _generate(self, prompt_ids: list[int], params):
        """The final RequestOutput of one engine request (`prompt_ids`: a list of Python ints, as TokensPrompt takes)."""
        from vllm.inputs import TokensPrompt

        final = None
        prompt = TokensPrompt(prompt_token_ids=prompt_ids)
        async for output in self._engine.generate(prompt, params, str(next(self._ids))):
            final = output
        return final

    async def _sample(self, request: GenerateRequest, index: int, submitted: float) -> None:
        # One array of each per engine request: more than one when weight updates aborted it.
        ids: list[np.ndarray] = []
        logprobs: list[np.ndarray] = []
        versions: list[np.ndarray] = []
        generated = 0
        budget = request.sampling.max_new_tokens
        try:
            for attempt in itertools.count():
                await self._serving.wait()
                params = self._params(request.sampling, index, attempt, budget - generated)
                c = (await self._generate(np.concatenate([request.prompt_ids, *ids]).tolist(), params)).outputs[0]
                n = len(c.token_ids)
                ids.append(np.asarray(c.token_ids, dtype=np.int32))
                logprobs.append(np.fromiter((pos[tok].logprob for pos, tok in zip(c.logprobs, c.token_ids, strict=True)),
                                            dtype=np.float32, count=n))
                spans = c.weight_versions or ()
                versions.append(np.repeat(np.array([int(s.version) for s in spans], dtype=np.int32),
                                          [s.end - s.start for s in spans]))
                generated += n
                finish = c.finish_reason
                # "abort" means a weight update interrupted the sample: continue it on new weights.
                if finish != "abort":
                    break
                if generated >= budget:
                    finish = "length"
                    break
            # The constructor refuses version labels that do not cover every token.
            trajectory = Trajectory(
                prompt_id=request.prompt_id,
                sample_index=index,
                prompt_ids=request.prompt_ids,
                output_ids=np.concatenate(ids),
                logprobs=np.concatenate(logprobs),
                versions=np.concatenate(versions),
                finish_reason=finish,
                generate_s=time.monotonic() - submitted,
                data_source=request.data_source,
            )
            self._done.put_nowait(trajectory)
        except Exception as e:  # one sample fails alone; the caller learns why from finished()
            self._done.put_nowait(SampleFailed(request.prompt_id, index, f"{type(e).__name__}: {e}"))

    async def init_weight_group(self, host: str, port: int, world_size: int, rank_offset: int,
                                stage: int = 0) -> None:
        """Join one weight group as ranks rank_offset .. rank_offset + tp - 1 (one per vLLM worker).

        Blocks until the group's sender (WeightSender) and every other member joined, at most
        startup_timeout_s. Call once per trainer pipeline stage, in stage order, on every generator;
        joining stage 0 again replaces every group joined before (new members).
        """
        from vllm.distributed.weight_transfer.base import WeightTransferInitRequest

        info = {"host": host, "port": port, "world_size": world_size, "rank_offset": rank_offset,
                "timeout_s": self.cfg.startup_timeout_s, "stage": stage}
        await self._call(self._engine.init_weight_transfer_engine(WeightTransferInitRequest(init_info=info)))

    async def update_weights(self, version: int) -> WeightUpdate:
        """Pause, receive `version` from every joined weight group, label it, resume.

        The senders must send `version` at the same time. A refused update (names, shapes or
        version not matching the served model) raises WeightMismatch and the engine keeps serving
        its old weights and version; a broken transfer raises WeightTransferError. The version
        served may come again: an update broken by a lost member of the weight group is sent again
        to all (areal_hpc/controller/scheduler.py), also to those that had it whole.
        """
        from vllm.distributed.weight_transfer.base import WeightTransferUpdateRequest
        from vllm.v1.engine.exceptions import EngineDeadError

        if version < self._version:
            raise ValueError(f"weight version {version}: the generator already serves version {self._version}")
        async with self._update_lock:
            start = time.perf_counter()
            self._serving.clear()
            await self._call(self._engine.pause_generation(mode=self.mode, clear_cache=self.mode != "keep"))
            try:
                await self._call(self._engine.start_weight_update())
                await self._call(self._engine.update_weights(WeightTransferUpdateRequest(update_info={"version": version})))
                await self._call(self._engine.finish_weight_update())
                reports = await self._call(self._engine.collective_rpc("last_weight_update"))
                refused = sorted({reason for r in reports for reason in r["refused"]})
                if refused:
                    raise WeightMismatch(
                        f"weight update to version {version} refused; still serving version {self._version}: "
                        + "; ".join(refused)
                    )
                if any(r["checksums"] != reports[0]["checksums"] for r in reports):
                    raise RuntimeError("the engine's workers received different tensors")
                await self._call(self._engine.update_weight_version(str(version)))
                self._version = version
            except (WeightMismatch, EngineDeadError):  # a dead engine fails the generator, not the transfer
                raise
            except Exception as e:
                raise WeightTransferError(
                    f"weight update to version {version} failed ({e}); still labelled version "
                    f"{self._version}, but layers received before the failure hold new weights"
                ) from e
            finally:
                self.engine_stats.interrupt()
                if not self._engine.errored:  # a dead engine's error is the one raised above
                    await self._call(self._engine.resume_generation())
                self._serving.set()
            return WeightUpdate(version, time.perf_counter() - start, reports[0]["checksums"])

    async def recompute_logprobs(self, sequences: Sequence[tuple[Sequence[int], Sequence[int]]]) -> list[list[float]]:
        """Log-prob of every output token given its prompt and preceding output, current weights.

        `sequences` holds (prompt_ids, output_ids) pairs. Runs between weight updates, so every
        value comes from one version (for tests and for measuring train/inference mismatch).
        """
        from vllm import SamplingParams as VllmSamplingParams
        from vllm.sampling_params import RequestOutputKind

        params = VllmSamplingParams(max_tokens=1, prompt_logprobs=0, output_kind=RequestOutputKind.FINAL_ONLY)

        async def one(prompt: Sequence[int], output: Sequence[int]) -> list[float]:
            output = [int(t) for t in output]
            final = await self._generate([*map(int, prompt), *output], params)
            lps = final.prompt_logprobs
            return [lps[len(prompt) + i][tok].logprob for i, tok in enumerate(output)]

        async with self._update_lock:
            return list(await asyncio.gather(*(one(p, o) for p, o in sequences)))

    async def shutdown(self) -> None:
        """Cancel unfinished samples and stop the engine and its worker processes."""
        for task in list(self._tasks):
            task.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)
        if self._engine is not None:
            self._engine.shutdown()
            self._engine = None

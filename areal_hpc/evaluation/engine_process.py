"""One evaluation engine: a process that runs the training generator's vLLM engine on prompts sent
over a pipe, and sends back every sample as it finishes.

The engine is `rollout.generator.Generator`, so evaluation samples with exactly the engine settings
of training (rollout/engine_args.py: dtype, KV-cache size on CPU, chunked prefill, the pinned start
method, model runner and scheduling; per-sample seeds). The process gets its devices through `env`
(CUDA_VISIBLE_DEVICES on GPU), applied before vLLM or torch starts.

Messages, parent -> engine: `Prompt`, or None to stop. Engine -> parent: `Ready()`,
`Finished(...)` per sample, `Failed(reason, user)` once, after which the engine exits.
No mpi4py import here (vLLM's engine core re-imports the main module in a child process).
"""

from __future__ import annotations

import asyncio
import os
import traceback
from dataclasses import dataclass
from multiprocessing.connection import Connection

import numpy as np

from areal_hpc.config.schema import ExperimentConfig
from areal_hpc.errors import UserError
from areal_hpc.metrics.library_logs import quiet_libraries
from areal_hpc.wire.messages import SamplingParams

# Seconds between looks at the pipe while samples are generating.
POLL_S = 0.005


@dataclass(frozen=True)
class Prompt:
    """Sample `n` completions of one prompt; `key` names it in the replies."""

    key: int
    ids: np.ndarray
    n: int
    sampling: SamplingParams


@dataclass(frozen=True)
class Ready:
    pass


@dataclass(frozen=True)
class Finished:
    key: int
    sample: int
    output_ids: np.ndarray
    finish_reason: str


@dataclass(frozen=True)
class Failed:
    reason: str
    # The user's mistake (a prompt the model cannot take, a bad model directory), not a bug.
    user: bool


def serve(conn: Connection, cfg: ExperimentConfig, model_dir: str, env: dict[str, str], cpu_bind: str | None) -> None:
    """The process's entry point: serve prompts until told to stop or the parent goes away."""
    os.environ.update(env)
    if cfg.logging.level != "DEBUG":
        quiet_libraries()
    try:
        asyncio.run(_serve(conn, cfg, model_dir, cpu_bind))
    except UserError as e:
        conn.send(Failed(str(e), user=True))
    except Exception:  # the parent names this engine and reports the traceback
        conn.send(Failed(traceback.format_exc(), user=False))
    finally:
        conn.close()


async def _forward(gen, conn: Connection) -> None:
    from areal_hpc.rollout.generator import SampleFailed

    while True:
        try:
            t = await gen.finished()
        except SampleFailed as e:
            raise RuntimeError(f"the engine failed a sample of {e}") from None
        conn.send(Finished(t.prompt_id, t.sample_index, t.output_ids, t.finish_reason))


async def _serve(conn: Connection, cfg: ExperimentConfig, model_dir: str, cpu_bind: str | None) -> None:
    from areal_hpc.rollout.generator import Generator
    from areal_hpc.wire.messages import GenerateRequest

    gen = Generator(cfg, model_dir, cpu_bind=cpu_bind)
    try:
        await gen.start()
        conn.send(Ready())
        forward = asyncio.get_running_loop().create_task(_forward(gen, conn))
        while True:
            while not conn.poll():
                if forward.done():
                    forward.result()  # raises what stopped it
                await asyncio.sleep(POLL_S)
            msg = conn.recv()
            if msg is None:
                break
            gen.submit(GenerateRequest(msg.key, msg.ids, msg.n, msg.sampling))
        forward.cancel()
    finally:
        await gen.shutdown()

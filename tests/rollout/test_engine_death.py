"""A generator whose vLLM engine core dies (SIGKILL, the out-of-memory killer) fails its next
control call at once: vLLM leaves such a call (pause, a weight update) waiting forever for the
dead core's reply, which left a generator hung inside a weight update and broke the update for
every other member of its weight group (found by benchmarks/chaos.py's engine-kill)."""

from __future__ import annotations

import asyncio
import os
import signal
import time

import psutil
import pytest

from areal_hpc.config.load import load_config
from areal_hpc.rollout.generator import Generator

pytestmark = pytest.mark.faults


def test_a_weight_update_on_a_dead_engine_raises_engine_dead_at_once(tiny_model_dir):
    from vllm.v1.engine.exceptions import EngineDeadError

    async def scenario() -> float:
        gen = Generator(load_config("configs/experiments/tiny-cpu.yaml"), tiny_model_dir)
        await gen.start()
        try:
            cores = [p for p in psutil.Process().children(recursive=True) if p.name().startswith("VLLM::EngineCor")]
            assert cores, [p.name() for p in psutil.Process().children(recursive=True)]
            for p in cores:
                os.kill(p.pid, signal.SIGKILL)
            start = time.monotonic()
            with pytest.raises(EngineDeadError):
                await asyncio.wait_for(gen.update_weights(1), timeout=60)
            return time.monotonic() - start
        finally:
            await gen.shutdown()

    assert asyncio.run(scenario()) < 30

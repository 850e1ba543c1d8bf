"""One trainer rank in its own process for tests/trainer/test_device_and_fp16.py.

    python tests/trainer/device_worker.py SCENARIO OUT MODEL

Scenarios (each saves OUT/<scenario>.pt; the assertions live in the test module):
- fp16: the same PPO step from the same weights in fp16, once from a loss scale of 2^32 (whose
  first optimizer steps overflow and are skipped) and once from 2^10 (no skip);
- fp16_nan: an fp16 step on a batch with a NaN log-prob, which no loss scale can rescue;
- cpu_on_gpu_machine: `device: cpu` where torch reports a GPU (torch.cuda.is_available() made to
  answer True before anything asks): the step must run on the CPU through the compatibility layer.
"""

from __future__ import annotations

import math
import socket
import sys
import traceback
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).parent))

from trainer_worker import config, hf_tensors, step, trajectories, with_behaviour  # noqa: E402


def _port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _engine(model_dir: str, *overrides: str):
    from areal_hpc.trainer.engine import TrainEngine
    from areal_hpc.trainer.parallel import init_trainer_world

    cfg = config(1, 1, 1, *overrides)
    init_trainer_world(cfg, 0, 1, f"tcp://127.0.0.1:{_port()}")
    engine = TrainEngine(cfg)
    engine.load_hf(model_dir)
    return engine


def _trained(model_dir: str, scale: float) -> dict:
    engine = _engine(model_dir, "trainer.params_dtype=fp16", f"trainer.initial_loss_scale={scale}")
    metrics = step(engine, with_behaviour(engine, trajectories(), seed=0))
    return {"metrics": metrics, "version": engine.version, "optimizer_steps": engine.optimizer_steps,
            "weights": hf_tensors(engine)}


def fp16(model_dir: str) -> dict:
    return {"from_2^32": _trained(model_dir, 2.0**32), "from_2^10": _trained(model_dir, 2.0**10)}


def fp16_nan(model_dir: str) -> dict:
    engine = _engine(model_dir, "trainer.params_dtype=fp16", "trainer.initial_loss_scale=8")
    batch = with_behaviour(engine, trajectories(), seed=0)
    batch[0].logprobs[0] = math.nan
    try:
        step(engine, batch)
    except RuntimeError as e:
        return {"raised": str(e), "version": engine.version, "optimizer_steps": engine.optimizer_steps}
    return {"raised": None}


def cpu_on_gpu_machine(model_dir: str) -> dict:
    torch.cuda.is_available = lambda: True  # what a GPU machine answers
    from areal_hpc.trainer import cpu_compat

    engine = _engine(model_dir, "device=cpu")
    metrics = step(engine, with_behaviour(engine, trajectories(), seed=0))
    return {"metrics": metrics, "active": cpu_compat.active(),
            "devices": sorted({str(p.device) for p in engine.model.parameters()})}


def main(scenario: str, out: Path, model_dir: str) -> None:
    try:
        result = {"fp16": fp16, "fp16_nan": fp16_nan, "cpu_on_gpu_machine": cpu_on_gpu_machine}[scenario](model_dir)
    except Exception:
        result = {"error": traceback.format_exc()}
    torch.save(result, out / f"{scenario}.pt")


if __name__ == "__main__":
    main(sys.argv[1], Path(sys.argv[2]), sys.argv[3])

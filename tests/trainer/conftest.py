"""Launch the trainer worker (tests/trainer/trainer_worker.py) once per scenario and share its results.

Real megatron-core runs in separate processes started by torch.distributed.run (gloo, one thread
per rank), never in the pytest process, so the trainer's process groups and Megatron's global
state cannot leak into other tests.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

WORKER = Path(__file__).with_name("trainer_worker.py")


def run_worker(scenario: str, nproc: int, out: Path, model_dir: Path, tied_dir: Path) -> list[dict]:
    """Run one scenario on `nproc` ranks; the per-rank results, or a test failure with the log."""
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", f"--nproc-per-node={nproc}",
           str(WORKER), scenario, str(out), str(model_dir), str(tied_dir)]
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONWARNINGS": "ignore"}
    proc = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=900)
    files = [out / f"{scenario}-rank{r}.pt" for r in range(nproc)]
    if not all(f.is_file() for f in files):
        pytest.fail(f"worker {scenario} exited {proc.returncode}:\n{proc.stderr[-4000:]}")
    results = [torch.load(f, weights_only=False) for f in files]
    for r, result in enumerate(results):
        if "error" in result:
            pytest.fail(f"worker {scenario} rank {r} failed:\n{result['error']}")
    return results


@pytest.fixture(scope="session")
def trainer_out(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("trainer")


@pytest.fixture(scope="session")
def tied_model_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The tiny Qwen2 with tied input and output embeddings."""
    from areal_hpc.config.load import load_config
    from areal_hpc.data.tiny_model import build_tiny_model

    cfg = load_config("configs/experiments/tiny-cpu.yaml", ["model.tie_word_embeddings=true"])
    return build_tiny_model(cfg.model, tmp_path_factory.mktemp("tiny-tied"), seed=1)


@pytest.fixture(scope="session")
def single_run(trainer_out: Path, tiny_model_dir: Path, tied_model_dir: Path) -> dict:
    return run_worker("single", 1, trainer_out, tiny_model_dir, tied_model_dir)[0]


@pytest.fixture(scope="session")
def layouts_run(trainer_out: Path, tiny_model_dir: Path, tied_model_dir: Path) -> list[dict]:
    return run_worker("layouts", 2, trainer_out, tiny_model_dir, tied_model_dir)


@pytest.fixture(scope="session")
def resume_runs(trainer_out: Path, tiny_model_dir: Path, tied_model_dir: Path) -> tuple[list[dict], list[dict]]:
    """An uninterrupted run that also saves a checkpoint, then fresh processes resuming from it."""
    return tuple(run_worker(s, 2, trainer_out, tiny_model_dir, tied_model_dir) for s in ("resume_a", "resume_b"))


@pytest.fixture(scope="session")
def groups_run(trainer_out: Path, tiny_model_dir: Path, tied_model_dir: Path) -> list[dict]:
    return run_worker("groups", 8, trainer_out, tiny_model_dir, tied_model_dir)


@pytest.fixture(scope="session")
def cuda_run(trainer_out: Path, tiny_model_dir: Path, tied_model_dir: Path) -> dict:
    return run_worker("cuda", 1, trainer_out, tiny_model_dir, tied_model_dir)[0]

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


def run_worker(scenario: str, nproc: int, out: Path, model_dir: Path, tied_dir: Path,
               worker: Path = WORKER) -> list[dict]:
    """Run one scenario of `worker` on `nproc` ranks; the per-rank results, or a test failure
    with the log."""
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", f"--nproc-per-node={nproc}",
           str(worker), scenario, str(out), str(model_dir), str(tied_dir)]
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


def sharpen(model_dir: Path, seed: int) -> None:
    """Norm weights away from their initial ones (a swapped or lost norm shows) and q/k
    projections 4x larger (attention, and with it RoPE, then moves the logits)."""
    from safetensors.torch import load_file, save_file

    file = model_dir / "model.safetensors"
    tensors, g = load_file(str(file)), torch.Generator().manual_seed(seed)
    for name, t in tensors.items():
        if name.endswith("norm.weight"):
            t.add_(0.3 * torch.randn(t.shape, generator=g))
        elif name.endswith(("q_proj.weight", "k_proj.weight")):
            t.mul_(4.0)
    save_file(tensors, str(file), metadata={"format": "pt"})


@pytest.fixture(scope="session")
def family_model_dirs(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """Random tiny models saved by transformers' Qwen2/Qwen3/LlamaForCausalLM, one folder each
    (then sharpened)."""
    from trainer_worker import FAMILY_SHAPES

    from areal_hpc.config.load import load_config
    from areal_hpc.data.tiny_model import build_tiny_model

    root = tmp_path_factory.mktemp("families")
    dirs = {}
    for seed, (family, shape) in enumerate(FAMILY_SHAPES.items()):
        cfg = load_config("configs/experiments/tiny-cpu.yaml", [
            "model.hidden_size=64", "model.intermediate_size=128", "model.num_layers=2", *shape])
        dirs[family] = build_tiny_model(cfg.model, root / family, seed=seed)
        sharpen(dirs[family], seed)
    return dirs


@pytest.fixture(scope="session")
def families_run(trainer_out: Path, family_model_dirs: dict[str, Path]) -> list[dict]:
    root = next(iter(family_model_dirs.values())).parent
    return run_worker("families", 2, trainer_out, root, root)

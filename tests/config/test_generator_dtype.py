"""generator.dtype: "auto" (the default) is the trainer's dtype on the device, the dtype its weight
updates arrive in; the shipped configs serve what their trainers send."""

from __future__ import annotations

from pathlib import Path

import pytest

from areal_hpc.config.load import load_config
from areal_hpc.config.validate import generator_dtype, params_dtype
from areal_hpc.errors import ConfigError

EXPERIMENTS = sorted(Path("configs/experiments").glob("*.yaml"))


def test_auto_is_the_trainers_dtype() -> None:
    cfg = load_config("configs/experiments/tiny-cpu.yaml", ["trainer.params_dtype=auto", "generator.dtype=auto"])
    assert generator_dtype(cfg, "cpu") == "fp32" and generator_dtype(cfg, "cuda") == "bf16"
    cfg = load_config("configs/experiments/tiny-cpu.yaml", ["trainer.params_dtype=fp16", "generator.dtype=auto"])
    assert generator_dtype(cfg, "cpu") == generator_dtype(cfg, "cuda") == "fp16"
    # A dtype of its own is kept (an evaluation may serve a checkpoint in another one).
    cfg = load_config("configs/experiments/tiny-cpu.yaml", ["generator.dtype=bf16"])
    assert generator_dtype(cfg, "cpu") == "bf16"


def test_auto_is_the_default_and_a_bad_dtype_is_named() -> None:
    cfg = load_config("configs/experiments/tiny-cpu.yaml")
    assert type(cfg.generator)().dtype == "auto"
    with pytest.raises(ConfigError, match=r"generator.dtype.*'fp64'.*auto"):
        load_config("configs/experiments/tiny-cpu.yaml", ["generator.dtype=fp64"])


@pytest.mark.parametrize("path", EXPERIMENTS, ids=[p.stem for p in EXPERIMENTS])
def test_shipped_configs_serve_what_their_trainers_send(path: Path) -> None:
    cfg = load_config(path, check_files=False)
    for device in ("cpu", "cuda") if cfg.device == "auto" else (cfg.device,):
        assert generator_dtype(cfg, device) == params_dtype(cfg, device), (path, device)

"""Trainer rules: the training dtype per device (auto, and fp32 refused on CUDA), and the
activation-recomputation settings."""

from __future__ import annotations

import pytest

from areal_hpc.config.load import load_config
from areal_hpc.config.validate import params_dtype, validate
from areal_hpc.errors import ConfigError

GPU = ["device=cuda", "cluster.gpus_per_node=1", "cluster.train_nodes=1", "cluster.rollout_nodes=1"]


def tiny(*overrides: str):
    return load_config("configs/experiments/tiny-cpu.yaml", list(overrides))


def refusal(*overrides: str) -> str:
    """What loading the tiny config with `overrides` is refused for ("" when it loads)."""
    try:
        tiny(*overrides)
    except ConfigError as e:
        return str(e)
    return ""


@pytest.mark.parametrize("dtype,cpu,cuda", [("auto", "fp32", "bf16"), ("bf16", "bf16", "bf16"),
                                             ("fp16", "fp16", "fp16")])
def test_params_dtype_per_device(dtype, cpu, cuda):
    cfg = tiny(f"trainer.params_dtype={dtype}")
    assert (params_dtype(cfg, "cpu"), params_dtype(cfg, "cuda")) == (cpu, cuda)


def test_fp32_on_cuda_is_refused_saying_why():
    cfg = tiny("trainer.params_dtype=fp32")
    assert params_dtype(cfg, "cpu") == "fp32"
    with pytest.raises(ConfigError, match="no fp32 attention kernel for packed .THD. micro-batches"):
        params_dtype(cfg, "cuda")
    refused = refusal(*GPU, "trainer.params_dtype=fp32")
    assert refused.startswith("trainer.params_dtype = 'fp32': not on CUDA") and refused.endswith("(from --set)")
    # auto on cuda, and a device left to auto (decided by the trainer at start), pass the check
    assert refusal(*GPU, "trainer.params_dtype=auto") == ""
    assert refusal(*GPU, "device=auto", "trainer.params_dtype=fp32") == ""


def test_schema_default_is_auto():
    from areal_hpc.config.schema import TrainerConfig

    assert TrainerConfig().params_dtype == "auto"


@pytest.mark.parametrize("overrides,message", [
    (["trainer.recompute=partial"], "trainer.recompute = 'partial': must be one of none, selective, full"),
    (["trainer.recompute=full", "trainer.recompute_method=every"],
     "trainer.recompute_method = 'every': must be one of uniform, block"),
    (["trainer.recompute=full", "trainer.recompute_num_layers=3"],
     "trainer.recompute_num_layers = 3: must divide the 4 layers of a pipeline stage"),
    (["trainer.recompute=full", "trainer.pp=2", "trainer.recompute_method=block", "trainer.recompute_num_layers=3"],
     "trainer.recompute_num_layers = 3: more than the 2 layers of a pipeline stage"),
    (["trainer.recompute_num_layers=0"], "trainer.recompute_num_layers = 0: must be >= 1 or null"),
    (["trainer.recompute=selective", "trainer.recompute_modules=[]"], "selective recomputation needs at least one"),
    (["trainer.recompute_modules=[mlp,layernorm]"], "trainer.recompute_modules = ['mlp', 'layernorm']: must list"),
    (["trainer.logprob_chunk_tokens=0"], "trainer.logprob_chunk_tokens = 0: must be >= 1"),
])
def test_recompute_settings_are_checked(overrides, message):
    assert message in refusal(*overrides)


@pytest.mark.parametrize("overrides", [
    ["trainer.recompute=full"], ["trainer.recompute=full", "trainer.recompute_num_layers=2"],
    ["trainer.recompute=full", "trainer.recompute_method=block", "trainer.recompute_num_layers=3"],
    ["trainer.recompute=selective", "trainer.recompute_modules=[mlp,core_attn]"],
])
def test_valid_recompute_settings_pass(overrides):
    assert validate(tiny(*overrides), check_files=False) == []
    assert refusal(*overrides) == ""

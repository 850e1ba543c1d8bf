"""The pinned vLLM configuration (rollout/engine_args.py) as the GPU path will get it: decided here
for device "cuda" too, so a change that leaves CUDA engines to vLLM's defaults fails on CPU.
The real CPU engines' side of it is checked in test_generator.py (test_the_engine_core_...)."""

from __future__ import annotations

import os

import pytest

from areal_hpc.config.load import load_config
from areal_hpc.errors import UserError
from areal_hpc.rollout.engine_args import apply_env, conflicts, describe, engine_setup
from areal_hpc.slurm.plan_report import describe as plan


@pytest.mark.parametrize("device", ["cuda", "cpu"])
@pytest.mark.parametrize("mode", ["abort", "keep"])
def test_every_device_gets_spawn_the_v1_runner_and_no_async_scheduling(device, mode):
    cfg = load_config("configs/experiments/tiny-cpu.yaml")
    cfg.generator.interrupt_mode = mode
    setup = engine_setup(cfg, device)
    assert setup.env["VLLM_WORKER_MULTIPROC_METHOD"] == "spawn"
    assert setup.env["VLLM_USE_V2_MODEL_RUNNER"] == "0"
    assert setup.kwargs["async_scheduling"] is False
    assert setup.kwargs["enable_prefix_caching"] is (mode != "keep")


def test_the_engine_arguments_follow_the_device():
    cfg = load_config("configs/experiments/code-32b.yaml")
    gpu, cpu = engine_setup(cfg, "cuda").kwargs, engine_setup(cfg, "cpu").kwargs
    assert (gpu["enforce_eager"], gpu["kv_cache_memory_bytes"], gpu["enable_chunked_prefill"]) == (False, None, True)
    assert gpu["weight_transfer_config"] == {"backend": "areal_nccl"}
    assert gpu["dtype"] == "float16"  # generator.dtype auto: the trainers' params_dtype
    assert gpu["tensor_parallel_size"] == cfg.generator.tensor_parallel_size == 4
    assert (cpu["enforce_eager"], cpu["enable_chunked_prefill"]) == (True, False)
    assert cpu["kv_cache_memory_bytes"] == cfg.generator.kv_cache_bytes
    with pytest.raises(ValueError, match="'auto'"):
        engine_setup(cfg, "auto")


def test_every_setting_is_one_vllm_accepts():
    from vllm.engine.arg_utils import AsyncEngineArgs

    cfg = load_config("configs/experiments/code-32b.yaml")
    for device in ("cuda", "cpu"):
        args = AsyncEngineArgs(model="unused", **engine_setup(cfg, device).kwargs)
        assert args.async_scheduling is False


def test_a_conflicting_user_setting_is_refused_and_a_matching_one_kept(monkeypatch):
    wanted = {"VLLM_WORKER_MULTIPROC_METHOD": "spawn", "VLLM_USE_V2_MODEL_RUNNER": "0"}
    assert conflicts({"VLLM_WORKER_MULTIPROC_METHOD": "fork", "VLLM_USE_V2_MODEL_RUNNER": "0"}, wanted) == [
        "VLLM_WORKER_MULTIPROC_METHOD=fork"]
    monkeypatch.setenv("VLLM_USE_V2_MODEL_RUNNER", "1")
    with pytest.raises(UserError, match="VLLM_USE_V2_MODEL_RUNNER=1 in the environment"):
        apply_env(wanted)
    monkeypatch.setenv("VLLM_USE_V2_MODEL_RUNNER", "0")
    monkeypatch.delenv("VLLM_WORKER_MULTIPROC_METHOD", raising=False)
    apply_env(wanted)
    assert os.environ["VLLM_WORKER_MULTIPROC_METHOD"] == "spawn"


@pytest.mark.parametrize("name", ["code-32b", "tiny-cpu"])
def test_the_plan_names_the_pinned_vllm_settings(name):
    cfg = load_config(f"configs/experiments/{name}.yaml")
    line = "vLLM engines: engine core started by spawn, V1 model runner, async scheduling off"
    assert line in plan(cfg).splitlines()
    assert describe(engine_setup(cfg, "cuda")) == line

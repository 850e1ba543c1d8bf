"""The vLLM engine configuration of every engine the project starts (training generators, evaluation
engines, benchmarks): all of them go through `rollout.generator.Generator`, which takes its engine
arguments and environment from `engine_setup` here and nowhere else.

Pinned, on every device, because CUDA vLLM 0.32 would otherwise run code the CPU build never runs
and the project's tests never ran:
- The engine core starts by spawn. On CUDA vLLM forks it unless VLLM_WORKER_MULTIPROC_METHOD says
  otherwise (utils/system_utils.get_mp_context; only the CPU platform forces spawn). A forked
  engine keeps the rank's descriptors (its lifeline to rank 0), MPI state, and misses the
  parent-death guard that the re-imported main module installs (launch.py's `__mp_main__`), so a
  generator killed outright would leave its engine holding the GPUs and the lifeline open.
- The V1 model runner (VLLM_USE_V2_MODEL_RUNNER=0): vLLM picks Model Runner V2 wherever Triton is
  installed (config/vllm.py, VllmConfig.use_v2_model_runner), i.e. on every CUDA node.
- No async scheduling (on by default on CUDA, forced off on CPU). Pause/abort/keep, per-token
  weight versions, processed log-probs and prompt log-probs were tested without it.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from areal_hpc.config.schema import ExperimentConfig
from areal_hpc.config.validate import generator_dtype
from areal_hpc.errors import UserError

DEVICES = ("cpu", "cuda")
_DTYPES = {"fp32": "float32", "bf16": "bfloat16", "fp16": "float16"}
_WORKER_EXTENSION = "areal_hpc.rollout.weight_receiver.WeightTransferWorker"

START_METHOD_ENV = "VLLM_WORKER_MULTIPROC_METHOD"
V2_RUNNER_ENV = "VLLM_USE_V2_MODEL_RUNNER"
# Read by vLLM in this process and, inherited, in the engine core and its workers.
PINNED_ENV = {START_METHOD_ENV: "spawn", V2_RUNNER_ENV: "0"}


@dataclass(frozen=True)
class EngineSetup:
    """What one engine is built from: AsyncEngineArgs keywords (all but the model and tokenizer
    paths) and the environment that must be in place before it is built."""

    kwargs: dict[str, Any]
    env: dict[str, str]


def engine_setup(cfg: ExperimentConfig, device: str) -> EngineSetup:
    """The engine arguments and environment of a generator of `cfg` on `device` ("cpu" or "cuda")."""
    if device not in DEVICES:
        raise ValueError(f"device {device!r}: must be one of {DEVICES}")
    g = cfg.generator
    cpu = device == "cpu"
    kwargs = dict(
        dtype=_DTYPES[generator_dtype(cfg, device)],
        tensor_parallel_size=g.tensor_parallel_size,
        max_num_seqs=g.max_num_seqs,
        seed=cfg.seed,
        # vLLM's default memory reservation fails on CPU; a fixed KV-cache size works.
        kv_cache_memory_bytes=g.kv_cache_bytes if cpu else None,
        gpu_memory_utilization=g.gpu_memory_utilization,
        # Eager on CPU: no torch.compile at start (the engine then starts in ~25 s here).
        enforce_eager=cpu,
        # In "keep" mode requests continue on new weights, and new ones must not reuse KV blocks
        # computed under old weights.
        enable_prefix_caching=g.interrupt_mode != "keep",
        # vLLM 0.32's CPU runner crashes the engine ("CPU Generator does not use offset") when
        # a seeded request's prefill is split over steps; on CPU every prefill runs whole.
        # vLLM then warns that disabling chunked prefill is unsupported; the rollout tests
        # check outputs and log-probs against a default engine.
        enable_chunked_prefill=not cpu,
        async_scheduling=False,
        weight_transfer_config={"backend": "gloo" if cpu else "areal_nccl"},
        worker_extension_cls=_WORKER_EXTENSION,
        disable_log_stats=True,
        # Per-iteration batch sizes for engine_stats; vLLM's own stat logging stays off.
        enable_logging_iteration_details=True,
        # Each token's log-prob under the distribution it was sampled from (after temperature),
        # which is what the trainer computes for pi_prox; vLLM's default reports the raw
        # logits' log-probs, which differ from it at any temperature but 1.
        logprobs_mode="processed_logprobs",
    )
    return EngineSetup(kwargs, dict(PINNED_ENV))


def conflicts(env: Mapping[str, str], wanted: Mapping[str, str]) -> list[str]:
    """The variables of `wanted` that `env` sets to something else, as 'NAME=value' of `env`."""
    return [f"{k}={env[k]}" for k, v in wanted.items() if k in env and env[k] != v]


def apply_env(wanted: Mapping[str, str]) -> None:
    """Set `wanted` in this process's environment for good: vLLM reads these variables here at
    every engine call too, not only in the processes it starts. A different value the user set
    is refused rather than overridden."""
    clash = conflicts(os.environ, wanted)
    if clash:
        raise UserError(f"{', '.join(clash)} in the environment: every vLLM engine of the project runs with"
                        f" {', '.join(f'{k}={v}' for k, v in wanted.items())} (areal_hpc/rollout/engine_args.py);"
                        " unset it")
    os.environ.update(wanted)


def describe(setup: EngineSetup) -> str:
    """One line for `areal-hpc slurm plan`: the pinned settings an engine of `setup` runs with."""
    runner = "V2" if setup.env[V2_RUNNER_ENV] == "1" else "V1"
    scheduling = "on" if setup.kwargs["async_scheduling"] else "off"
    return (f"vLLM engines: engine core started by {setup.env[START_METHOD_ENV]}, {runner} model runner,"
            f" async scheduling {scheduling}")

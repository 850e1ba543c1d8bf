"""Helpers of the rollout tests: bad-update transforms for the checkpoint sender, and a fresh engine.

The fresh engine runs in a spawned process (vLLM's in-process mode there): it is the reference that a
generator updated over the wire must reproduce.
"""

from __future__ import annotations

import multiprocessing as mp
import os
import socket

# Tensors whose edits make an update not match the model.
RENAMED = "model.norm.weight"
RESHAPED = "model.layers.0.mlp.up_proj.weight"


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def rename_one(tensors):
    """A checkpoint transform: one tensor under a name the model does not have."""
    return [(name + "_renamed" if name == RENAMED else name, t) for name, t in tensors]


def truncate_one(tensors):
    """A checkpoint transform: one tensor one row short."""
    return [(name, t[:-1] if name == RESHAPED else t) for name, t in tensors]


def _fresh_engine_main(model_dir: str, prompts: list[list[int]], max_tokens: int, out) -> None:
    os.environ["VLLM_ENABLE_V1_MULTIPROCESSING"] = "0"
    from vllm import LLM, SamplingParams
    from vllm.inputs import TokensPrompt

    llm = LLM(model=model_dir, dtype="float32", kv_cache_memory_bytes=64 * 2**20, enforce_eager=True,
              distributed_executor_backend="uni", seed=1)
    params = SamplingParams(max_tokens=max_tokens, temperature=0.0, logprobs=0)
    results = llm.generate([TokensPrompt(prompt_token_ids=p) for p in prompts], params)
    out.put([
        (list(r.outputs[0].token_ids), [lp[t].logprob for lp, t in zip(r.outputs[0].logprobs, r.outputs[0].token_ids,
                                                                       strict=True)])
        for r in results
    ])


def fresh_engine_greedy(model_dir: str, prompts: list[list[int]], max_tokens: int) -> list[tuple[list[int], list[float]]]:
    """Greedy (tokens, log-probs) of each prompt from a new vLLM engine loaded from `model_dir`."""
    ctx = mp.get_context("spawn")
    out = ctx.Queue()
    process = ctx.Process(target=_fresh_engine_main, args=(str(model_dir), prompts, max_tokens, out))
    process.start()
    try:
        return out.get(timeout=300)
    finally:
        process.join(timeout=60)

"""The GPU path: weights over vLLM's NCCL communicator into a CUDA generator.

Needs two GPUs: the sender and the generator's worker are NCCL ranks, which may not share a device.
"""

from __future__ import annotations

import asyncio

import pytest
from rollout_processes import free_port, fresh_engine_greedy

from areal_hpc.config.load import load_config
from areal_hpc.rollout.checkpoint_sender import CheckpointSender, read_checkpoint
from areal_hpc.rollout.generator import Generator
from areal_hpc.rollout.weight_transfer import checksum
from areal_hpc.wire.messages import GenerateRequest, SamplingParams

pytestmark = pytest.mark.cuda

PROMPTS = [[5, 6, 7, 8], [100, 200, 300], [42] * 9]


def test_an_nccl_update_reproduces_a_fresh_engine_of_the_new_checkpoint(tiny_model_dir, tiny_model_dir_b):
    import torch

    if torch.cuda.device_count() < 2:
        pytest.skip("needs two GPUs (one for the sender, one for the generator)")
    cfg = load_config("configs/experiments/tiny-cpu.yaml")
    cfg.device = "cuda"
    port = free_port()
    sender = CheckpointSender("127.0.0.1", port, 2, backend="nccl", gpu=1)
    gen = Generator(cfg, tiny_model_dir)

    async def scenario():
        try:
            await gen.start()
            await gen.init_weight_group("127.0.0.1", port, 2, 1)
            sender.send(1, tiny_model_dir_b)
            update = await gen.update_weights(1)
            sent = await asyncio.to_thread(sender.result)
            for i, p in enumerate(PROMPTS):
                gen.submit(GenerateRequest(i, p, 1, SamplingParams(32, temperature=0.0)))
            done = [await gen.finished() for _ in PROMPTS]
            return update, sent, {t.prompt_id: t for t in done}
        finally:
            await gen.shutdown()

    try:
        update, sent, done = asyncio.run(scenario())
    finally:
        sender.close()
    assert update.checksums == sent["checksums"] == {n: checksum(t) for n, t in read_checkpoint(tiny_model_dir_b)}
    reference = fresh_engine_greedy(str(tiny_model_dir_b), PROMPTS, 32)
    for i, (tokens, _) in enumerate(reference):
        assert done[i].output_ids.tolist() == tokens
        assert set(done[i].versions) == {1}

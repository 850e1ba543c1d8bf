"""The GPU path: weights over vLLM's NCCL communicator into a CUDA generator, and its failure path.

Needs two GPUs: the sender and the generator's worker are NCCL ranks, which may not share a device.
"""

from __future__ import annotations

import asyncio
import multiprocessing as mp
import os
import time

import pytest
from rollout_processes import free_port, fresh_engine_greedy

from areal_hpc.config.load import load_config
from areal_hpc.rollout.checkpoint_sender import CheckpointSender, read_checkpoint
from areal_hpc.rollout.generator import Generator
from areal_hpc.rollout.weight_transfer import Link, WeightSender, WeightTransferError, bucketed, checksum
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


# The sender's deadline in the dying-receiver test: the collective's timeout_s.
DEADLINE_S = 20


def _nccl_sender(port: int, results) -> None:
    """Rank 0 on GPU 1: reports whether joining kept its CUDA stream, and how the send ended."""
    import torch

    torch.cuda.set_device(1)
    before = torch.cuda.current_stream().cuda_stream
    sender = WeightSender("127.0.0.1", port, 2, "nccl", timeout_s=DEADLINE_S)
    kept = torch.cuda.current_stream().cuda_stream == before
    tensors = [(f"w{i}", torch.ones(2**26, device="cuda")) for i in range(4)]  # 256 MiB each
    start = time.monotonic()
    try:
        sender.send(1, bucketed(tensors, 2**28))
        outcome = "sent"
    except WeightTransferError as e:
        outcome = str(e)
    results.put((kept, outcome, time.monotonic() - start))
    sender.close()  # after the abort: no second one


def _nccl_receiver_dying_after_the_vote(port: int) -> None:
    import torch

    torch.cuda.set_device(0)
    link = Link("nccl", "127.0.0.1", port, 1, 2, timeout_s=60)
    link.recv_header()
    link.sum(0)
    os._exit(0)  # no close: as a killed generator


def test_a_receiver_dying_mid_update_fails_the_nccl_send_by_its_deadline():
    """Without the deadline the sender's wait would spin on the GPU for ever."""
    import torch

    if torch.cuda.device_count() < 2:
        pytest.skip("needs two GPUs (one per NCCL rank)")
    ctx = mp.get_context("spawn")
    results = ctx.Queue()
    port = free_port()
    processes = [ctx.Process(target=_nccl_sender, args=(port, results)),
                 ctx.Process(target=_nccl_receiver_dying_after_the_vote, args=(port,))]
    for p in processes:
        p.start()
    try:
        kept, outcome, seconds = results.get(timeout=300)
    finally:
        for p in processes:
            p.join(timeout=60)
    assert kept, "joining the NCCL group changed the sender's current CUDA stream"
    assert outcome.startswith(f"weight group at 127.0.0.1:{port}, rank 0 of 2: broadcast of 'w"), outcome
    assert outcome.endswith("; the communicator was aborted"), outcome
    assert seconds < DEADLINE_S + 30
    assert processes[0].exitcode == 0

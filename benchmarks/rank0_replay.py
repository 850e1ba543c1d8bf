"""Rank 0 receiving paper-length trajectories from many generator ranks at once (run under mpiexec).

Ranks 1..N-1 play generators: each sends --per-rank scored trajectories of --output-tokens tokens,
one right after the other, with the real Channel.send of a Trajectory built from arrays, as a
generator rank sends each sample once its reward is in. Rank 0 plays the controller: its real
Scheduler admits every prompt first, then rank 0 receives with the real Channel.poll as the
controller rank does (drain what has arrived, sleep POLL_S when nothing has) and hands each
trajectory to the scheduler (`on_trajectory`, then `poll`), which trains all of them as one batch
at the end. Rank 0 prints one JSON line: trajectories and generated tokens per second from its
--warmup-th receipt to its last.

Usage: OMP_NUM_THREADS=1 .venv/bin/mpiexec -n 17 .venv/bin/python benchmarks/rank0_replay.py
"""

from __future__ import annotations

import argparse
import json
import time

import numpy as np
from mpi4py import MPI

from areal_hpc.controller.scheduler import Policy, Scheduler, Submit, Train
from areal_hpc.wire.messages import Trajectory
from areal_hpc.wire.transport import POLL_S, Channel

GROUP_SIZE = 16  # samples per prompt (the paper's)
PROMPT_TOKENS = 256
VOCAB = 151_936  # Qwen2's


def prompt_id(rank: int, senders: int, k: int) -> int:
    """The prompt of the k-th trajectory `rank` sends: the scheduler issues prompt ids 0, 1, ...
    and sender r takes every senders-th one."""
    return rank - 1 + senders * (k // GROUP_SIZE)


def generator(chan: Channel, per_rank: int, output_tokens: int) -> None:
    rng = np.random.default_rng(chan.rank)
    prompt = rng.integers(0, VOCAB, PROMPT_TOKENS, dtype=np.int32)
    output = rng.integers(0, VOCAB, output_tokens, dtype=np.int32)
    logprobs = (-rng.exponential(1.0, output_tokens)).astype(np.float32)
    versions = np.repeat(np.array([3, 4], dtype=np.int32), [output_tokens // 2, output_tokens - output_tokens // 2])
    for k in range(per_rank):
        chan.send(0, Trajectory(prompt_id(chan.rank, chan.size - 1, k), k % GROUP_SIZE, prompt, output, logprobs, versions, "stop",
                                reward=5.0, reward_reason="correct", generate_s=60.0, reward_s=0.01))
    if not chan.flush(timeout=600):
        raise RuntimeError(f"rank {chan.rank}: sends not complete after 600 s")


def controller(chan: Channel, per_rank: int, warmup: int) -> dict:
    total = per_rank * (chan.size - 1)
    groups = total // GROUP_SIZE
    policy = Policy(eta=1 << 20, batch_prompts=groups, group_size=GROUP_SIZE, max_concurrent=groups, gate="strict",
                    total_steps=1)
    sched = Scheduler(policy, list(range(1, chan.size)), train_size=groups, held_out_size=0, shuffle=False)
    sched.start_training()
    admitted = [c.prompt_id for c in sched.poll() if isinstance(c, Submit)]
    if admitted != list(range(groups)):
        raise RuntimeError(f"the scheduler admitted {len(admitted)} prompts, not {groups}")
    received, tokens, first, last = 0, 0, 0.0, 0.0
    batch: list[Train] = []
    while received < total:
        got = chan.poll()
        if got is None:
            time.sleep(POLL_S)
            continue
        sched.on_trajectory(got[1])
        batch += [c for c in sched.poll() if isinstance(c, Train)]
        received += 1
        last = time.perf_counter()
        if received == warmup:
            first = last
        elif received > warmup:
            tokens += len(got[1].output_ids)
    if len(batch) != 1 or len(batch[0].groups) != groups:
        raise RuntimeError(f"expected one batch of all {groups} groups, got {[len(b.groups) for b in batch]}")
    seconds = last - first
    return {"senders": chan.size - 1, "trajectories": total - warmup, "seconds": seconds,
            "trajectories_per_s": (total - warmup) / seconds, "generated_tokens_per_s": tokens / seconds,
            "output_tokens": tokens // (total - warmup)}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--per-rank", type=int, default=256, help="trajectories each sender sends (groups of 16)")
    parser.add_argument("--output-tokens", type=int, default=12_000)
    parser.add_argument("--warmup", type=int, default=64, help="receipts before the clock starts")
    args = parser.parse_args()
    chan = Channel(MPI.COMM_WORLD)
    if chan.rank == 0:
        print(json.dumps(controller(chan, args.per_rank, args.warmup)), flush=True)
    else:
        generator(chan, args.per_rank, args.output_tokens)


if __name__ == "__main__":
    main()

"""The control plane at the paper's scale: what the weight sender holds and what rank 0's lifelines cost.

1. `weight_sender_peak_extra_buckets`: a stage leader's extra memory during one full weight
   update, in bucket sizes. A sender process pushes a model of --model-gib GiB in --bucket-mib
   buckets to a receiver process over a real gloo weight group. Each bucket is made when the
   sender asks for it, as the trainer's export gathers a bucket's tensor-parallel shards, so what
   the sender holds is what it has taken from the stream and not yet let go. Two modes, each in a
   fresh process: `listed` (every bucket taken before the first is sent: the sender before issue
   14) and `streamed` (a plan first, then at most the bucket on the wire and the next). Peak
   extra = the process's peak resident memory (VmHWM, reset just before) during the update minus
   its resident memory before it.
2. Lifelines: rank 0's LifelineServer with --lifelines connections (a 513-rank job has 512): the
   time for all of them to connect and be named, and the cost of one `ended()` poll with all of
   them held (rank 0 polls every loop turn, ~2 ms), which epoll keeps independent of the count.
3. `serialize_s_per_gb`: CPU seconds (process time, best of 3) to encode plus decode a batch of
   paper-length trajectories (12,000 generated tokens each; the 8,192 of a paper step scaled
   down), per GB of its encoding, side by side: `lists` (the trajectory before issue 14: Python
   lists pickled by mpi4py's default pickle) and `arrays` (messages.py's int32/float32 arrays
   through transport.encode/decode, Channel's own pkl5 pickling).
4. `rank0_trajectories_per_s`: benchmarks/rank0_replay.py under mpiexec, 16 generator-like ranks
   sending 12,000-token trajectories with the real Channel.send while rank 0 receives them with
   the real Channel.poll into the real Scheduler; median of 3 runs. `rank0_headroom` = its
   generated tokens/s over the 512-GPU demand (~400k tokens/s, ~33 such trajectories/s).
5. `fanout_bytes_ratio`: the most bytes that leave any one rank for one step's batch, over the
   batch's bytes (its WholeBatch pickled: benchmarks/fanout_ranks.py), before (rank 0 -> trainer 0 -> every other trainer)
   and now (rank 0 -> each replica root its shard -> a broadcast within the replica). Computed
   for math-1.5b, code-32b and each sweep's 512-GPU point on one paper-size batch (8,192
   trajectories, ~12k tokens each), with the real batch plan and rank map, the broadcast modelled
   as a binomial tree: its root sends ceil(log2 n) copies for n ranks, the most of any rank.
   That is MPICH's choice below 8 ranks (the measured replicas of 4: the root sends 2 copies), and
   above them an upper bound on its scatter + allgather (about 2 copies from any rank). Measured:
   benchmarks/fanout_ranks.py under mpiexec, tp 2 x pp 2 x dp 4 (17 ranks), every byte over TCP
   and counted per rank by the kernel.
6. `controller_us_per_trajectory`: the real Scheduler (controller/scheduler.py) driven event by
   event with 1,000 and with 10,000 prompts in flight (16 samples each, 512-prompt batches, 256
   generators, log-normal generation times): CPU time of every scheduler call per finished
   sample, and `controller_cost_ratio` = the 10,000 figure over the 1,000 one.

Writes control_plane.json and .png under --out and prints a table.
Usage: .venv/bin/python benchmarks/control_plane.py [--quick] [--out benchmarks/results]
"""

from __future__ import annotations

import argparse
import heapq
import json
import multiprocessing as mp
import os
import random
import resource
import socket
import subprocess
import sys
import time
from dataclasses import dataclass, fields
from pathlib import Path

import numpy as np
import torch

from areal_hpc.config.load import load_config
from areal_hpc.controller.scheduler import Policy, Scheduler, Submit, Train
from areal_hpc.wire.lifeline import LifelineServer, greeting
from areal_hpc.wire.messages import TrainShard, Trajectory
from areal_hpc.wire.network import free_port

MODES = ("listed", "streamed")


def _status_bytes(field: str) -> int:
    with open("/proc/self/status") as f:
        return next(int(line.split()[1]) for line in f if line.startswith(field + ":")) * 1024


def _reset_peak_rss() -> None:
    """Make VmHWM (the peak resident memory) the current resident memory (Linux >= 4.0)."""
    with open("/proc/self/clear_refs", "w") as f:
        f.write("5")


def _buckets(count: int, elements: int):
    for i in range(count):
        yield [(f"layer{i}.weight", torch.full((elements,), float(i)))]


def _sender(mode: str, port: int, count: int, elements: int, results) -> None:
    from areal_hpc.rollout.weight_transfer import WeightSender

    torch.set_num_threads(1)
    sender = WeightSender("127.0.0.1", port, 2)
    plan = [[(f"layer{i}.weight", torch.empty(elements, device="meta"))] for i in range(count)]
    _reset_peak_rss()
    before = _status_bytes("VmRSS")
    start = time.perf_counter()
    if mode == "listed":
        sender.send(1, _buckets(count, elements))
    else:
        sender.send(1, _buckets(count, elements), plan=plan)
    seconds = time.perf_counter() - start
    results.put({"extra_bytes": _status_bytes("VmHWM") - before, "send_s": seconds})
    sender.close()


def _receiver(port: int, done) -> None:
    from areal_hpc.rollout.weight_transfer import Link

    torch.set_num_threads(1)
    link = Link("gloo", "127.0.0.1", port, 1, 2)
    header = link.recv_header()
    link.sum(0)
    for _ in link.recv_buckets(header):
        pass
    link.close()
    done.put(True)


def measure_sender(mode: str, model_bytes: int, bucket_bytes: int) -> dict:
    elements = bucket_bytes // 4
    count = model_bytes // bucket_bytes
    ctx = mp.get_context("spawn")
    results, done = ctx.Queue(), ctx.Queue()
    port = free_port()
    procs = [ctx.Process(target=_sender, args=(mode, port, count, elements, results)),
             ctx.Process(target=_receiver, args=(port, done))]
    for p in procs:
        p.start()
    out = results.get(timeout=600)
    done.get(timeout=600)
    for p in procs:
        p.join(timeout=60)
    out.update(mode=mode, buckets=count, bucket_bytes=bucket_bytes, model_bytes=count * bucket_bytes,
               peak_extra_buckets=out["extra_bytes"] / bucket_bytes)
    return out


def measure_lifelines(count: int, polls: int = 200) -> dict:
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    need = 2 * count + 256
    if soft != resource.RLIM_INFINITY and soft < need:
        resource.setrlimit(resource.RLIMIT_NOFILE, (min(need, hard), hard))
    server = LifelineServer(range(1, count + 1))
    lines = []
    start = time.perf_counter()
    for rank in range(1, count + 1):
        s = socket.create_connection(server.address, timeout=10)
        s.sendall(greeting(server.secret, rank))
        lines.append(s)
        if rank % 64 == 0:
            server.ended()
    while len(server.held) < count:
        server.ended()
    connect_s = time.perf_counter() - start
    start = time.perf_counter()
    for _ in range(polls):
        server.ended()
    poll_us = (time.perf_counter() - start) / polls * 1e6
    lines.pop().close()
    deadline = time.monotonic() + 5
    gone: list[int] = []
    while not gone and time.monotonic() < deadline:
        gone = server.ended()
    for s in lines:
        s.close()
    server.close()
    return {"lifelines": count, "connect_and_name_s": connect_s, "poll_us": poll_us, "reported": gone}


# Prompts in flight at which the scheduler's cost per sample is measured.
IN_FLIGHT = (1_000, 10_000)


@dataclass(slots=True)
class _Sample:
    """A finished sample as the scheduler reads it (the measurement is of the scheduler alone)."""

    prompt_id: int
    sample_index: int


def measure_controller(in_flight: int, measured: int = 200_000, group_size: int = 16, generators: int = 256,
                       batch: int = 512, seed: int = 0) -> dict:
    """Drive the real Scheduler with `in_flight` prompts in flight (max_concurrent; eta large
    enough that it binds), 512-prompt batches and log-normal generation times; a step completes
    as soon as it is dispatched and every generator loads it at once. Timed: every scheduler
    call (events and polls), over `measured` samples after one generation's worth of warm-up."""
    policy = Policy(in_flight // batch + 2, batch, group_size, in_flight, "strict", total_steps=1 << 30)
    sched = Scheduler(policy, list(range(generators)), train_size=100_000, held_out_size=0)
    sched.start_training()
    rng = random.Random(seed)
    warmup = in_flight * group_size
    pending: list[tuple[float, int, int, list[float]]] = []
    now, done, spent, steps_before = 0.0, 0, 0.0, 0
    commands = sched.poll()
    while done < warmup + measured:
        started = time.perf_counter()
        trained = [c for c in commands if isinstance(c, Train)]
        for c in trained:
            sched.on_step_done(c.version + 1)
            sched.on_weights_sent(0, c.version + 1, {})
            for g in range(generators):
                sched.on_weights_loaded(g, c.version + 1, {})
        scheduling = time.perf_counter() - started
        for c in commands:
            if isinstance(c, Submit):  # one heap entry per prompt: its next sample to finish
                times = sorted(now + rng.lognormvariate(0.0, 1.0) for _ in range(group_size))
                heapq.heappush(pending, (times[0], c.prompt_id, 0, times))
        if not trained:
            now, pid, i, times = heapq.heappop(pending)
            if i + 1 < group_size:
                heapq.heappush(pending, (times[i + 1], pid, i + 1, times))
            sample = _Sample(pid, i)
        started = time.perf_counter()
        if trained:
            commands = sched.poll()
        else:
            sched.on_trajectory(sample)
            commands = sched.poll()
            done += 1
        scheduling += time.perf_counter() - started
        if done == warmup:
            steps_before = sched.version
        elif done > warmup:
            spent += scheduling
    return {"in_flight": in_flight, "samples": measured, "steps": sched.version - steps_before,
            "us_per_trajectory": spent / measured * 1e6}


# A paper step (math-1.5b: 512 prompts x 16 samples) and its trajectories' length (issue 14).
PAPER_BATCH = 8192
OUTPUT_TOKENS = 12_000
PROMPT_TOKENS = 256
# What rank 0 must take in at the 512-GPU sweep point: generated tokens per second (issue 14).
DEMAND_TOKENS_PER_S = 400_000


@dataclass
class _ListBatch:
    """A train shard as the wire carried it before trajectories held numpy arrays: each
    trajectory's fields (Trajectory's own, so none can be missed) with its arrays as lists."""

    version: int
    trajectories: list[dict]

    @classmethod
    def of(cls, shard: TrainShard) -> _ListBatch:
        return cls(shard.version, [{f.name: _as_list(getattr(t, f.name)) for f in fields(Trajectory)}
                                   for t in shard.trajectories])


def _as_list(value: object) -> object:
    return value.tolist() if isinstance(value, np.ndarray) else value


def _paper_batch(trajectories: int) -> TrainShard:
    """Scored 12,000-token trajectories, each sampled by two policy versions (interrupted once), as
    the controller sends them to a trainer replica (the only one of tiny-cpu: the whole batch)."""
    from areal_hpc.trainer.batch_plan import shards

    rng = np.random.default_rng(0)
    half = OUTPUT_TOKENS // 2
    batch = [Trajectory(i // 16, i % 16, rng.integers(0, 151_936, PROMPT_TOKENS),
                        rng.integers(0, 151_936, OUTPUT_TOKENS), -rng.exponential(1.0, OUTPUT_TOKENS),
                        [3] * half + [4] * (OUTPUT_TOKENS - half), "stop", reward=5.0, reward_reason="correct",
                        generate_s=60.0, reward_s=0.01) for i in range(trajectories)]
    (shard,) = shards(load_config(str(Path(__file__).parents[1] / "configs/experiments/tiny-cpu.yaml")), 4, batch)
    return shard


def _cpu_s(fn, repeats: int = 3) -> float:
    best = float("inf")
    for _ in range(repeats):
        start = time.process_time()
        fn()
        best = min(best, time.process_time() - start)
    return best


def measure_serialize(trajectories: int) -> list[dict]:
    """Item 3 of the module docstring, for a batch of `trajectories` (scaled to a paper step)."""
    from mpi4py import MPI

    from areal_hpc.wire.transport import decode, encode

    batch = _paper_batch(trajectories)
    lists = _ListBatch.of(batch)
    codecs = {"lists": (lambda: (MPI.pickle.dumps(lists), []), lambda wire: MPI.pickle.loads(wire[0])),
              "arrays": (lambda: encode(batch), lambda wire: decode(*wire))}
    rows = []
    for name, (dump, load) in codecs.items():
        wire = dump()
        size = len(wire[0]) + sum(memoryview(b).nbytes for b in wire[1])
        encode_s, decode_s = _cpu_s(dump), _cpu_s(lambda: load(wire))  # noqa: B023 (called at once)
        rows.append({"encoding": name, "trajectories": trajectories, "bytes": size, "encode_s": encode_s,
                     "decode_s": decode_s, "serialize_s_per_gb": (encode_s + decode_s) / (size / 1e9),
                     "paper_batch_gb": size * PAPER_BATCH / trajectories / 1e9,
                     "paper_batch_s": (encode_s + decode_s) * PAPER_BATCH / trajectories})
    return rows


def measure_rank0(per_rank: int, ranks: int = 17, runs: int = 3) -> dict:
    """Item 4 of the module docstring: `ranks - 1` senders of `per_rank` trajectories each."""
    command = [str(Path(sys.executable).with_name("mpiexec")), "-n", str(ranks), sys.executable,
               str(Path(__file__).with_name("rank0_replay.py")), "--per-rank", str(per_rank),
               "--output-tokens", str(OUTPUT_TOKENS)]
    results = []
    for _ in range(runs):
        proc = subprocess.run(command, env={**os.environ, "OMP_NUM_THREADS": "1"}, capture_output=True, text=True,
                              timeout=300)
        if proc.returncode != 0:
            raise RuntimeError(f"rank 0 replay failed: {proc.stdout[-2000:]}{proc.stderr[-2000:]}")
        results.append(json.loads(proc.stdout.strip().splitlines()[-1]))
    median = sorted(results, key=lambda r: r["trajectories_per_s"])[len(results) // 2]
    return {**median, "runs_trajectories_per_s": [r["trajectories_per_s"] for r in results],
            "demand_tokens_per_s": DEMAND_TOKENS_PER_S,
            "rank0_headroom": median["generated_tokens_per_s"] / DEMAND_TOKENS_PER_S}


# Item 5: the layouts of the fan-out figures, and the layout measured under mpiexec (17 ranks).
FANOUT_EXPERIMENTS = ("math-1.5b", "code-32b")
FANOUT_AT_512 = ("math-1.5b", "math-7b", "code-14b", "code-32b")
FANOUT_MEASURED = {"tp": 2, "pp": 2, "dp": 4}
FANOUT_MAX_NEW = {"paper": 27_648, "measured": 4096}  # generated tokens at most (paper: ~12k a trajectory)


def _experiment(name: str, overrides: list[str] | None = None):
    return load_config(str(Path(__file__).parents[1] / f"configs/experiments/{name}.yaml"), overrides or [])


def _fanout_layouts() -> dict:
    """The experiments' trainer layouts and each strong-scaling sweep's 512-GPU point (32k context)."""
    from areal_hpc.slurm.scaling import strong_scaling_overrides

    layouts = {name: _experiment(name) for name in FANOUT_EXPERIMENTS}
    for name in FANOUT_AT_512:
        layouts[f"{name} @ 512 GPUs"] = _experiment(name, strong_scaling_overrides(_experiment(name), 512, 32768, 1, "runs/sweep"))
    return layouts


def _tree_root_copies(ranks: int) -> int:
    """Copies of its message the root of a binomial-tree broadcast over `ranks` ranks sends,
    ceil(log2 ranks): the most that any rank of the tree sends."""
    return (ranks - 1).bit_length()


def fanout_computed(cfg, batch: list[Trajectory]) -> dict:
    """Item 5, computed: the bytes that leave each rank for one step's batch, from the real batch
    plan and rank map. Before: rank 0 sent the batch to trainer 0, which sent it to every other
    trainer. Now: rank 0 sends each replica root its shard; the root broadcasts it in its replica."""
    import pickle

    from fanout_ranks import WholeBatch

    from areal_hpc.trainer.batch_plan import shards
    from areal_hpc.wire.layout import CONTROLLER_RANK, generator_ranks, replica_ranks
    from areal_hpc.wire.messages import SaveCheckpoint, Shutdown, UpdateWeights

    batch_bytes = len(pickle.dumps(WholeBatch(0, batch), protocol=5))
    replicas = replica_ranks(cfg)
    copies = _tree_root_copies(len(replicas[0]))
    sent = {CONTROLLER_RANK: 0}
    shard_bytes, facts_bytes = [], []
    for shard, members in zip(shards(cfg, 0, batch), replicas, strict=True):
        size = len(pickle.dumps(shard, protocol=5))
        shard_bytes.append(size)
        facts_bytes.append(len(pickle.dumps((shard.version, shard.replica, shard.advantages, shard.minibatches,
                                             shard.batch_tokens, shard.batch_trajectories, shard.advantage_mean))))
        sent[CONTROLLER_RANK] += size
        sent[members[0]] = copies * size
    busiest = max(sent, key=sent.get)
    before = max(1, cfg.trainer_world - 1) * batch_bytes
    commands = {type(m).__name__: len(pickle.dumps(m, protocol=5))
                for m in (UpdateWeights(250, tuple(generator_ranks(cfg))),
                          SaveCheckpoint(f"{cfg.logging.dir}/checkpoints/step-000250", 250), Shutdown())}
    return {
        "tp": cfg.trainer.tp, "pp": cfg.trainer.pp, "dp": cfg.trainer.dp, "ranks": cfg.world_size,
        "trainers": cfg.trainer_world, "trajectories": len(batch), "tokens": sum(t.num_tokens for t in batch),
        "batch_bytes": batch_bytes, "before_bytes": before, "before_ratio": before / batch_bytes,
        "after_bytes": sent[busiest], "after_rank": busiest, "fanout_bytes_ratio": sent[busiest] / batch_bytes,
        "rank0_bytes": sent[CONTROLLER_RANK], "root_bytes": max(copies * b for b in shard_bytes),
        "root_copies": copies, "shard_bytes_mean": sum(shard_bytes) / len(shard_bytes),
        "shard_facts_bytes_mean": sum(facts_bytes) / len(facts_bytes),
        # A command: its pickle to each replica root, then the root's tree copies (with an 8-byte length).
        "commands": {name: {"bytes": size, "rank0_bytes": cfg.trainer.dp * size, "root_bytes": copies * (8 + size)}
                     for name, size in commands.items()},
    }


def measure_fanout(trajectories: int) -> dict:
    """Item 5, measured: benchmarks/fanout_ranks.py under mpiexec, every byte over TCP and counted
    by the kernel, beside the computed figures for the same layout and batch."""
    from fanout_ranks import synthetic_batch

    t = FANOUT_MEASURED
    ranks = 1 + t["tp"] * t["pp"] * t["dp"]
    command = [str(Path(sys.executable).with_name("mpiexec")), "-n", str(ranks), sys.executable,
               str(Path(__file__).with_name("fanout_ranks.py")), "--tp", str(t["tp"]), "--pp", str(t["pp"]),
               "--dp", str(t["dp"]), "--trajectories", str(trajectories), "--max-new", str(FANOUT_MAX_NEW["measured"])]
    env = {**os.environ, "OMP_NUM_THREADS": "1", "UCX_TLS": "tcp", "MPIR_CVAR_NOLOCAL": "1"}
    proc = subprocess.run(command, env=env, capture_output=True, text=True, timeout=300)
    if proc.returncode != 0:
        raise RuntimeError(f"fan-out ranks failed: {proc.stdout[-2000:]}{proc.stderr[-2000:]}")
    measured = json.loads(proc.stdout.strip().splitlines()[-1])
    cfg = _experiment("tiny-cpu", [f"trainer.{k}={v}" for k, v in t.items()] + ["ppo.minibatches=4"])
    computed = fanout_computed(cfg, synthetic_batch(trajectories, FANOUT_MAX_NEW["measured"]))
    # As a user types it from the repository root: no path of this machine in the results.
    shown = ["UCX_TLS=tcp MPIR_CVAR_NOLOCAL=1 .venv/bin/mpiexec", "-n", str(ranks), ".venv/bin/python",
             "benchmarks/fanout_ranks.py", *command[5:]]
    return {**measured, "command": " ".join(shown), "computed": computed}


def fanout(quick: bool) -> dict:
    """Item 5: computed for each paper layout on one paper-size batch, and measured here."""
    from fanout_ranks import synthetic_batch

    batch = synthetic_batch(PAPER_BATCH // 8 if quick else PAPER_BATCH, FANOUT_MAX_NEW["paper"])
    computed = {name: fanout_computed(cfg, batch) for name, cfg in _fanout_layouts().items()}
    measured = measure_fanout(128 if quick else 512)
    return {"computed": computed, "measured": measured,
            "fanout_bytes_ratio": max([r["fanout_bytes_ratio"] for r in computed.values()]
                                      + [measured["shards"]["ratio"]])}


def table(report: dict) -> str:
    lines = ["| sender | model | bucket | buckets | peak extra memory | in buckets | send s |",
             "|---|---|---|---|---|---|---|"]
    for r in report["sender"]:
        lines.append(f"| {r['mode']} | {r['model_bytes'] / 2**30:.2f} GiB | {r['bucket_bytes'] / 2**20:.0f} MiB |"
                     f" {r['buckets']} | {r['extra_bytes'] / 2**20:.0f} MiB | {r['peak_extra_buckets']:.2f} |"
                     f" {r['send_s']:.1f} |")
    lines += ["", "| lifelines held | connect and name all, s | one ended() poll, us | reported after one hangs up |",
              "|---|---|---|---|"]
    for r in report["lifelines"]:
        lines.append(f"| {r['lifelines']} | {r['connect_and_name_s']:.2f} | {r['poll_us']:.1f} | {r['reported']} |")
    lines += ["", "| trajectories | encoding | bytes per prompt or output token | encode s | decode s | serialize s per GB |"
              " paper batch: GB | paper batch: encode + decode s |", "|---|---|---|---|---|---|---|---|"]
    for r in report["serialize"]:
        tokens = r["trajectories"] * (PROMPT_TOKENS + OUTPUT_TOKENS)
        lines.append(f"| {r['trajectories']} | {r['encoding']} | {r['bytes'] / tokens:.1f} | {r['encode_s']:.3f} |"
                     f" {r['decode_s']:.3f} | {r['serialize_s_per_gb']:.2f} | {r['paper_batch_gb']:.2f} |"
                     f" {r['paper_batch_s']:.1f} |")
    r = report["rank0"]
    lines += ["", "| senders | trajectories | rank 0: trajectories/s (runs) | generated tokens/s | rank0_headroom |",
              "|---|---|---|---|---|",
              f"| {r['senders']} | {r['trajectories']} | {r['trajectories_per_s']:.0f} "
              f"({', '.join(f'{x:.0f}' for x in r['runs_trajectories_per_s'])}) |"
              f" {r['generated_tokens_per_s'] / 1e6:.1f} M | {r['rank0_headroom']:.0f} |"]
    lines += ["", "| layout (tp x pp x dp) | ranks | batch GB | before: busiest rank / batch | now: busiest rank /"
              " batch (rank) | replica root / batch |", "|---|---|---|---|---|---|"]
    f = report["fanout"]
    for name, r in [*f["computed"].items(), ("measured here", f["measured"]["computed"])]:
        lines.append(f"| {name} ({r['tp']} x {r['pp']} x {r['dp']}) | {r['ranks']} | {r['batch_bytes'] / 1e9:.3f} |"
                     f" {r['before_ratio']:.0f} | {r['fanout_bytes_ratio']:.4f} ({r['after_rank']}) |"
                     f" {r['root_bytes'] / r['batch_bytes']:.3f} |")
    m = f["measured"]
    lines.append(f"| measured: bytes out of the sockets, {m['ranks']} ranks | {m['ranks']} | {m['batch_bytes'] / 1e9:.3f} |"
                 f" {m['forward']['ratio']:.2f} | {m['shards']['ratio']:.4f} ({m['shards']['max_rank']}) |"
                 f" {max(m['shards']['sent'][1:]) / m['batch_bytes']:.3f} |")
    c = report["controller"]
    lines += ["", "| prompts in flight | samples timed | steps | scheduler us per sample |", "|---|---|---|---|"]
    for r in c["runs"]:
        lines.append(f"| {r['in_flight']} | {r['samples']} | {r['steps']} | {r['us_per_trajectory']:.2f} |")
    lines.append(f"| controller_cost_ratio | | | {c['controller_cost_ratio']:.2f} |")
    return "\n".join(lines)


def plot(report: dict, path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(2, 3, figsize=(18, 8))
    a, b, c, d, e, f = axes.flat
    rows = report["sender"]
    a.bar([r["mode"] for r in rows], [r["peak_extra_buckets"] for r in rows], color=["C3", "C0"])
    a.axhline(2, color="k", ls="--", lw=1, label="goal: 2 buckets")
    a.set_ylabel("sender's peak extra memory (buckets)")
    a.set_title(f"Weight update of {rows[0]['model_bytes'] / 2**30:.1f} GiB in "
                f"{rows[0]['bucket_bytes'] / 2**20:.0f} MiB buckets", fontsize=10)
    a.legend()
    lines = report["lifelines"]
    b.plot([r["lifelines"] for r in lines], [r["poll_us"] for r in lines], "o-")
    b.set_xscale("log", base=2)
    b.set_xlabel("lifelines held by rank 0")
    b.set_ylabel("one ended() poll (us)")
    b.set_ylim(bottom=0)
    b.set_title("Rank 0's lifeline poll cost", fontsize=10)
    rows = report["serialize"]
    c.bar([r["encoding"] for r in rows], [r["serialize_s_per_gb"] for r in rows], color=["C3", "C0"])
    c.axhline(0.5, color="k", ls="--", lw=1, label="goal: 0.5 s/GB")
    c.set_yscale("log")
    c.set_ylabel("encode + decode CPU s per GB")
    c.set_title(f"Batch of {rows[0]['trajectories']} trajectories of {OUTPUT_TOKENS} tokens", fontsize=10)
    c.legend()
    r = report["rank0"]
    d.bar(["demand (512 GPUs)", "goal (10x)", "rank 0 sustains"],
          [DEMAND_TOKENS_PER_S / 1e6, 10 * DEMAND_TOKENS_PER_S / 1e6, r["generated_tokens_per_s"] / 1e6],
          color=["C7", "C7", "C0"])
    d.set_ylabel("generated tokens/s (millions)")
    d.set_title(f"Rank 0 receiving from {r['senders']} ranks: {r['rank0_headroom']:.0f}x the demand", fontsize=10)
    rows = report["fanout"]["computed"]
    x = np.arange(len(rows))
    e.bar(x - 0.2, [r["before_ratio"] for r in rows.values()], 0.4, color="C3", label="before: trainer 0 forwards")
    e.bar(x + 0.2, [r["fanout_bytes_ratio"] for r in rows.values()], 0.4, color="C0", label="now: shards + broadcast")
    e.axhline(2, color="k", ls="--", lw=1, label="goal: 2")
    e.set_xticks(x, [n.replace(" @ ", "\n") for n in rows], fontsize=7)
    e.set_yscale("log")
    e.set_ylabel("busiest rank's bytes / batch bytes")
    e.set_title("One step's batch fan-out", fontsize=10)
    e.legend(fontsize=8)
    runs = report["controller"]["runs"]
    f.bar([f"{r['in_flight']:,} in flight" for r in runs], [r["us_per_trajectory"] for r in runs], color="C0")
    f.set_ylabel("scheduler CPU us per finished sample")
    f.set_title(f"Rank 0's scheduler: cost ratio {report['controller']['controller_cost_ratio']:.2f} (goal 1.5)",
                fontsize=10)
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="a 256 MiB model and up to 1024 lifelines")
    parser.add_argument("--model-gib", type=float, default=None, help="model size (default 1.0; --quick 0.25)")
    parser.add_argument("--bucket-mib", type=int, default=64)
    parser.add_argument("--out", type=Path, default=Path(__file__).parent / "results")
    args = parser.parse_args()
    model_bytes = int((args.model_gib or (0.25 if args.quick else 1.0)) * 2**30)
    bucket_bytes = args.bucket_mib * 2**20
    sender = [measure_sender(mode, model_bytes, bucket_bytes) for mode in MODES]
    counts = (64, 256, 1024) if args.quick else (64, 256, 1024, 4096)
    report = {"sender": sender, "lifelines": [measure_lifelines(n) for n in counts]}
    report["serialize"] = measure_serialize(32 if args.quick else 128)
    report["rank0"] = measure_rank0(64 if args.quick else 256)
    report["fanout"] = fanout(args.quick)
    runs = [measure_controller(n, 50_000 if args.quick else 200_000) for n in IN_FLIGHT]
    report["controller"] = {"runs": runs,
                            "controller_cost_ratio": runs[-1]["us_per_trajectory"] / runs[0]["us_per_trajectory"]}
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "control_plane.json").write_text(json.dumps(report, indent=1))
    plot(report, args.out / "control_plane.png")
    print(table(report))
    print(f"wrote {args.out / 'control_plane.json'} and {args.out / 'control_plane.png'}")


if __name__ == "__main__":
    main()

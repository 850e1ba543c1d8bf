"""Weight synchronisation: update latency against model bytes and generator count, wire rate against gloo.

For Qwen2 models of growing width (4 layers, the tiny model's tokenizer, fp32), one generator
(abort mode, idle) and a checkpoint sender in another process, the generator's weight group:
- update latency: `Generator.update_weights` seconds, pause -> resume (header, refusal vote,
  buckets, vLLM's layerwise reload, version label, resume), median of the updates;
- wire rate: model bytes / the sender's `transfer_s` (from the receivers' acceptance to the last
  bucket on the wire, packing included), median;
- baseline: one plain gloo broadcast of a buffer of the same bytes between two processes over the
  same kind of group, timed the same way at the sender, median. Goal: wire rate >= 0.8 x baseline.
With two or more GPUs, the plain broadcast is also measured over vLLM's NCCL communicator.

Generator count: for the smallest and the largest width, a full update (one broadcast from one sender reaching every
generator's vLLM worker in one gloo weight group) with 1, 2 and 3 idle generators. Its time is the
slowest generator's pause -> resume, median of the updates. A broadcast should stay close to flat as
receivers are added; goal: 3 generators <= 1.3 x 1 generator. The three engines start once (each
costs ~30-60 s and memory here) and the first k of them form a new group for count k. An engine
receives from every group it has joined, so after each count its members leave the group through
vLLM's `shutdown_weight_transfer_engine` (which closes our receiver's links; inference stays up).
On one machine the generators' receivers share its cores, unlike generators on separate nodes;
each engine is bound to its own core in turn (`cpu_bind_for`, as the generator ranks do), so with
more generators than cores two engines share one.

The numbers depend on the machine's load; the JSON records the load average at the start.

Usage: .venv/bin/python benchmarks/weight_sync.py [--quick] [--bucket-mib N] [--out benchmarks/results]
"""

from __future__ import annotations

import argparse
import asyncio
import dataclasses
import json
import multiprocessing as mp
import os
import socket
import statistics
import sys
import tempfile
import time
from collections.abc import Sequence
from pathlib import Path

import torch

from areal_hpc.config.load import load_config
from areal_hpc.data.tiny_model import build_tiny_model
from areal_hpc.rollout.checkpoint_sender import CheckpointSender, read_checkpoint
from areal_hpc.rollout.generator import Generator, cpu_bind_for
from areal_hpc.rollout.weight_transfer import Link
from areal_hpc.wire.device import cuda_visible

CONFIG = "configs/experiments/tiny-cpu.yaml"
GOAL = 0.8
GENERATOR_COUNTS = (1, 2, 3)
GOAL_RATIO_3_TO_1 = 1.3


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _broadcast_sender(backend: str, port: int, nbytes: int, repeats: int, out) -> None:
    torch.set_num_threads(1)  # as the checkpoint sender
    if backend == "nccl":
        torch.cuda.set_device(1)
    link = Link(backend, "127.0.0.1", port, 0, 2)
    buf = torch.ones(nbytes, dtype=torch.uint8, device=link.device)
    times = []
    for _ in range(repeats):
        link.sum(0)  # both sides ready
        start = time.perf_counter()
        link.broadcast(buf)()
        if backend == "nccl":
            torch.cuda.synchronize()
        times.append(time.perf_counter() - start)
    out.put(times)
    link.close()


def plain_broadcast_s(backend: str, nbytes: int, repeats: int) -> float:
    """Median seconds of one broadcast of `nbytes` from a spawned process to this one."""
    ctx = mp.get_context("spawn")
    out = ctx.Queue()
    port = free_port()
    process = ctx.Process(target=_broadcast_sender, args=(backend, port, nbytes, repeats, out))
    process.start()
    link = Link(backend, "127.0.0.1", port, 1, 2)
    buf = torch.empty(nbytes, dtype=torch.uint8, device=link.device)
    for _ in range(repeats):
        link.sum(0)
        link.broadcast(buf)()
    times = out.get(timeout=600)
    link.close()
    process.join()
    return statistics.median(times)


async def updates_by_count(model_dir: Path, counts: Sequence[int], updates: int, bucket_bytes: int) -> list[dict]:
    """Medians of `updates` weight updates of `model_dir` to the first k generators, for each k in `counts`.

    Starts max(counts) generators once; each count gets a new weight group and sender process.
    """
    cfg = load_config(CONFIG)
    gens = [Generator(cfg, model_dir, cpu_bind=cpu_bind_for(i)) for i in range(max(counts))]
    rows, version = [], 0
    try:
        for gen in gens:
            await gen.start()
        for count in counts:
            members = gens[:count]
            port = free_port()
            sender = CheckpointSender("127.0.0.1", port, count + 1, bucket_bytes=bucket_bytes)
            slowest, transfers, sends = [], [], []
            try:
                await asyncio.gather(*(g.init_weight_group("127.0.0.1", port, count + 1, 1 + i)
                                       for i, g in enumerate(members)))
                for _ in range(updates):
                    version += 1
                    sender.send(version, model_dir)
                    done = await asyncio.gather(*(g.update_weights(version) for g in members))
                    sent = await asyncio.to_thread(sender.result)
                    slowest.append(max(u.seconds for u in done))
                    transfers.append(sent["transfer_s"])
                    sends.append(sent["send_s"])
            finally:
                # Generator has no call to leave a group; vLLM's engine has (see the module docstring).
                await asyncio.gather(*(g._engine.shutdown_weight_transfer_engine() for g in members))
                sender.close()
            rows.append({"generators": count, "bytes": sent["bytes"], "update_s": statistics.median(slowest),
                         "transfer_s": statistics.median(transfers), "send_s": statistics.median(sends),
                         "all_update_s": slowest})
    finally:
        for gen in gens:
            await gen.shutdown()
    return rows


def model_of_width(hidden: int, out: Path) -> Path:
    cfg = load_config(CONFIG)
    model = dataclasses.replace(cfg.model, hidden_size=hidden, intermediate_size=3 * hidden,
                                num_attention_heads=hidden // 32, num_query_groups=hidden // 64)
    return build_tiny_model(model, out / f"h{hidden}", seed=0)


def measure(quick: bool, bucket_bytes: int) -> dict:
    load = os.getloadavg()[0]
    widths, updates, repeats = ([128, 512], 3, 3) if quick else ([128, 256, 512, 768, 1024], 5, 5)
    rows, model_dirs = [], {}
    nccl = cuda_visible() and torch.cuda.device_count() >= 2
    with tempfile.TemporaryDirectory() as tmp:
        for hidden in widths:
            model_dir = model_of_width(hidden, Path(tmp))
            nbytes = sum(t.nbytes for _, t in read_checkpoint(model_dir))
            [ours] = asyncio.run(updates_by_count(model_dir, [1], updates, bucket_bytes))
            gloo_s = plain_broadcast_s("gloo", nbytes, repeats)
            row = {"hidden": hidden, **ours, "gloo_broadcast_s": gloo_s,
                   "wire_bytes_per_s": nbytes / ours["transfer_s"], "gloo_bytes_per_s": nbytes / gloo_s,
                   "wire_over_gloo": gloo_s / ours["transfer_s"]}
            if nccl:
                row["nccl_bytes_per_s"] = nbytes / plain_broadcast_s("nccl", nbytes, repeats)
            rows.append(row)
            print(f"  hidden {hidden}: {nbytes / 2**20:.1f} MiB, update {ours['update_s']:.3f} s, "
                  f"wire {row['wire_bytes_per_s'] / 2**20:.0f} MiB/s, gloo {row['gloo_bytes_per_s'] / 2**20:.0f} MiB/s",
                  flush=True)
            model_dirs[hidden] = model_dir
        # The generator-count sweep at the smallest width (the CPU profile's tiny model: fixed
        # costs dominate) and the largest (bytes dominate).
        sweeps = []
        for hidden in (widths[0], widths[-1]):
            by_count = asyncio.run(updates_by_count(model_dirs[hidden], GENERATOR_COUNTS, updates, bucket_bytes))
            for r in by_count:
                print(f"  {r['generators']} generator(s), hidden {hidden}: update {r['update_s']:.3f} s, "
                      f"transfer {r['transfer_s']:.3f} s", flush=True)
            sweeps.append({"hidden": hidden, "rows": by_count,
                           "ratio_3_to_1": by_count[-1]["update_s"] / by_count[0]["update_s"],
                           "transfer_ratio_3_to_1": by_count[-1]["transfer_s"] / by_count[0]["transfer_s"]})
    return {"quick": quick, "load_average": load, "bucket_bytes": bucket_bytes, "goal_wire_over_gloo": GOAL,
            "wire_over_gloo_largest": rows[-1]["wire_over_gloo"],
            "nccl": "measured" if nccl else "not measured: needs two GPUs (this machine has none)", "models": rows,
            "generators": sweeps, "goal_ratio_3_to_1": GOAL_RATIO_3_TO_1}


def table(report: dict) -> str:
    lines = ["| hidden | MiB | update (pause->resume) s | transfer s | wire MiB/s | plain gloo MiB/s | wire / gloo |",
             "|---|---|---|---|---|---|---|"]
    for r in report["models"]:
        lines.append(f"| {r['hidden']} | {r['bytes'] / 2**20:.1f} | {r['update_s']:.3f} | {r['transfer_s']:.3f} |"
                     f" {r['wire_bytes_per_s'] / 2**20:.0f} | {r['gloo_bytes_per_s'] / 2**20:.0f} |"
                     f" {r['wire_over_gloo']:.2f} |")
    lines.append(f"NCCL: {report['nccl']}")
    for sweep in report["generators"]:
        lines += ["", f"hidden {sweep['hidden']}, one weight group:",
                  "| generators | update (slowest, pause->resume) s | transfer s | update - transfer s | update / 1 generator |",
                  "|---|---|---|---|---|"]
        one = sweep["rows"][0]["update_s"]
        for r in sweep["rows"]:
            lines.append(f"| {r['generators']} | {r['update_s']:.3f} | {r['transfer_s']:.3f} |"
                         f" {r['update_s'] - r['transfer_s']:.3f} | {r['update_s'] / one:.2f} |")
    return "\n".join(lines)


def plot(report: dict, path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    rows = report["models"]
    mib = [r["bytes"] / 2**20 for r in rows]
    fig, (ax1, ax2, ax3) = plt.subplots(1, 3, figsize=(15, 4))
    ax1.plot(mib, [r["update_s"] for r in rows], "o-", label="update, pause -> resume")
    ax1.plot(mib, [r["transfer_s"] for r in rows], "s-", label="transfer (sender)")
    ax1.plot(mib, [r["gloo_broadcast_s"] for r in rows], "^--", label="plain gloo broadcast")
    ax1.set_xlabel("model MiB (fp32)")
    ax1.set_ylabel("seconds")
    ax1.legend()
    ax2.plot(mib, [r["wire_bytes_per_s"] / 2**20 for r in rows], "s-", label="weight transfer")
    ax2.plot(mib, [r["gloo_bytes_per_s"] / 2**20 for r in rows], "^--", label="plain gloo broadcast")
    ax2.set_xlabel("model MiB (fp32)")
    ax2.set_ylabel("MiB/s")
    ax2.legend()
    for sweep, marker in zip(report["generators"], "os", strict=True):
        counts = [r["generators"] for r in sweep["rows"]]
        one = sweep["rows"][0]["update_s"]
        ax3.plot(counts, [r["update_s"] / one for r in sweep["rows"]], marker + "-",
                 label=f"update / 1 generator, hidden {sweep['hidden']}")
    ax3.axhline(GOAL_RATIO_3_TO_1, color="grey", ls=":", label=f"goal for 3: <= {GOAL_RATIO_3_TO_1}")
    ax3.set_xticks(counts)
    ax3.set_xlabel("generators in the group")
    ax3.set_ylabel("update time relative to 1 generator")
    ax3.set_ylim(bottom=0)
    ax3.legend()
    fig.suptitle(f"Weight sync over gloo, buckets of {report['bucket_bytes'] / 2**20:.0f} MiB"
                 + (" (--quick)" if report["quick"] else ""))
    fig.tight_layout()
    fig.savefig(path, dpi=120)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true",
                        help="two model widths, three updates per width and per generator count")
    parser.add_argument("--bucket-mib", type=int, default=load_config(CONFIG).generator.weight_bucket_bytes // 2**20)
    parser.add_argument("--out", type=Path, default=Path(__file__).parent / "results")
    args = parser.parse_args(argv)
    report = measure(args.quick, args.bucket_mib * 2**20)
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "weight_sync.json").write_text(json.dumps(report, indent=2) + "\n")
    plot(report, args.out / "weight_sync.png")
    print(table(report))
    wire_ok = report["wire_over_gloo_largest"] >= GOAL
    print(f"largest model: wire / plain gloo = {report['wire_over_gloo_largest']:.2f} (goal >= {GOAL}) "
          f"{'ok' if wire_ok else 'MISSED'}")
    ratio_ok = True
    for sweep in report["generators"]:
        ok = sweep["ratio_3_to_1"] <= GOAL_RATIO_3_TO_1
        ratio_ok &= ok
        print(f"hidden {sweep['hidden']}: update with 3 generators / with 1 = {sweep['ratio_3_to_1']:.2f} "
              f"(goal <= {GOAL_RATIO_3_TO_1}) {'ok' if ok else 'MISSED'}; transfer alone {sweep['transfer_ratio_3_to_1']:.2f}")
    print(f"wrote {args.out / 'weight_sync.json'} and {args.out / 'weight_sync.png'}")
    return 0 if wire_ok and ratio_ok else 1


if __name__ == "__main__":
    sys.exit(main())

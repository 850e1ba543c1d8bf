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

Writes control_plane.json and .png under --out and prints a table.
Usage: .venv/bin/python benchmarks/control_plane.py [--quick] [--out benchmarks/results]
"""

from __future__ import annotations

import argparse
import json
import multiprocessing as mp
import resource
import socket
import time
from pathlib import Path

import torch

from areal_hpc.runtime.lifeline import LifelineServer, greeting
from areal_hpc.runtime.network import free_port

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
    return "\n".join(lines)


def plot(report: dict, path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (a, b) = plt.subplots(1, 2, figsize=(10, 4))
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
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "control_plane.json").write_text(json.dumps(report, indent=1))
    plot(report, args.out / "control_plane.png")
    print(table(report))
    print(f"wrote {args.out / 'control_plane.json'} and {args.out / 'control_plane.png'}")


if __name__ == "__main__":
    main()

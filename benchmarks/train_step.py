"""Trainer throughput: tokens/s of a decoupled-PPO step, and model FLOPs utilisation on a GPU.

CPU (always): the tiny Qwen2 of the CPU profile at TP=1, TP=2 and PP=2 (one gloo process per
rank, one thread each), a PPO batch shaped like configs/experiments/tiny-cpu.yaml (8 prompts x 4
samples, outputs up to 256 tokens; the same batch every step). tokens/s = tokens of the batch / wall time of train_step
(which includes the pi_prox forward pass and every minibatch's forward, backward and optimizer
step), median over the timed steps after one warm-up step. Also tokens per CPU second (process
CPU time of all ranks together), which other work on a shared machine barely changes.

GPU (when CUDA is visible): a model of DeepSeek-R1-Distill-Qwen-1.5B's shape
(configs/models/DeepSeek-R1-Distill-Qwen-1.5B/config.json, random weights, bf16, Transformer Engine layers) on one GPU;
SFT steps (forward + backward + optimizer) on packed 4096-token sequences. Model FLOPs per token
= 6 x (matmul parameters, output layer included) + 6 x layers x hidden x sequence length
(causal attention scores and values, forward and backward); MFU = achieved / peak bf16 FLOP/s.

Writes train_step.json and train_step.png under --out and prints a table.
Usage: .venv/bin/python benchmarks/train_step.py [--quick] [--out benchmarks/results] [--peak-tflops X]
"""

from __future__ import annotations

import argparse
import json
import os
import random
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

LAYOUTS = {"tp1": (1, 1), "tp2": (2, 1), "pp2": (1, 2)}
# Dense bf16 peak FLOP/s by device name fragment.
PEAK_BF16 = {"H200": 989e12, "H100": 989e12, "H800": 989e12, "A100": 312e12, "A800": 312e12}


def ppo_batch(seed: int, prompts: int, group: int, max_prompt: int, max_new: int, vocab: int):
    from areal_hpc.wire.messages import Trajectory

    rng = random.Random(seed)
    out = []
    for p in range(prompts):
        prompt = [rng.randrange(vocab) for _ in range(rng.randint(max_prompt // 4, max_prompt))]
        for s in range(group):
            n = min(max_new, max(1, int(rng.lognormvariate(4.6, 0.6))))
            out.append(Trajectory(p, s, prompt, [rng.randrange(vocab) for _ in range(n)], [0.0] * n, [0] * n,
                                  "stop", reward=rng.choice([5.0, -5.0])))
    return out


def cpu_worker(layout: str, model_dir: str, steps: int, result_file: str) -> None:
    """One rank of the CPU measurement (run under torch.distributed.run)."""
    import torch

    from areal_hpc.config import load_config
    from areal_hpc.trainer.batch_plan import shards
    from areal_hpc.trainer.engine import TrainEngine
    from areal_hpc.trainer.parallel import init_trainer_world

    tp, pp = LAYOUTS[layout]
    cfg = load_config("configs/experiments/tiny-cpu.yaml", [f"trainer.tp={tp}", f"trainer.pp={pp}"])
    init_trainer_world(cfg, int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"]), "env://")
    engine = TrainEngine(cfg)
    engine.load_hf(model_dir)
    r = cfg.rollout
    seconds, cpu_seconds = [], []
    batch = ppo_batch(0, r.batch_prompts, r.group_size, r.max_prompt_len, r.max_new_tokens, cfg.model.vocab_size)
    for step in range(steps + 1):
        for t, lps in zip(batch, engine.compute_logprobs(batch), strict=True):
            t.logprobs, t.versions = lps, [engine.version] * len(lps)
        shard = shards(cfg, engine.version, batch)[engine.ranks.dp_rank]  # rank 0's work under the controller
        cpu_start = time.process_time()
        metrics = engine.train_step(shard)
        if step > 0:  # the first step pays for one-time allocations
            seconds.append(metrics["step_s"])
            cpu_seconds.append(time.process_time() - cpu_start)
    # CPU seconds of all ranks together: unlike wall time, barely changed by other work on the machine.
    cpu = torch.tensor([statistics.median(cpu_seconds)], dtype=torch.float64)
    torch.distributed.all_reduce(cpu)
    if int(os.environ["RANK"]) == 0:
        Path(result_file).write_text(json.dumps({
            "tokens_per_s": metrics["tokens"] / statistics.median(seconds), "step_s": statistics.median(seconds),
            "cpu_s": cpu.item(), "tokens_per_cpu_s": metrics["tokens"] / cpu.item(),
            "tokens_per_step": metrics["tokens"], "steps": steps, "ranks": tp * pp,
        }))


def measure_cpu(quick: bool) -> dict:
    from areal_hpc.config import load_config
    from areal_hpc.data.tiny_model import build_tiny_model

    steps = 2 if quick else 5
    results = {}
    with tempfile.TemporaryDirectory() as tmp:
        model_dir = build_tiny_model(load_config("configs/experiments/tiny-cpu.yaml").model, Path(tmp) / "tiny")
        for layout, (tp, pp) in LAYOUTS.items():
            result_file = Path(tmp) / f"{layout}.json"
            cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", f"--nproc-per-node={tp * pp}",
                   __file__, "--cpu-worker", layout, str(model_dir), str(steps), str(result_file)]
            env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONWARNINGS": "ignore"}
            proc = subprocess.run(cmd, env=env, capture_output=True, text=True)
            if proc.returncode != 0 or not result_file.is_file():
                raise SystemExit(f"{layout} failed:\n{proc.stderr[-3000:]}")
            results[layout] = json.loads(result_file.read_text())
    return results


def model_flops_per_token(m, seq_len: int) -> float:
    h, f, L, v = m.hidden_size, m.intermediate_size, m.num_layers, m.vocab_size
    qkv = h * (m.num_attention_heads + 2 * m.num_query_groups) * m.head_size
    matmul_params = L * (qkv + m.num_attention_heads * m.head_size * h + 3 * h * f) + v * h
    return 6 * matmul_params + 6 * L * h * seq_len


def measure_gpu(quick: bool, peak_tflops: float | None) -> dict:
    """SFT steps of a 1.5B-shaped model on one GPU (run directly, world of one)."""
    import torch

    from areal_hpc.config import load_config
    from areal_hpc.trainer.engine import TrainEngine
    from areal_hpc.trainer.parallel import init_trainer_world

    seq_len, per_step = 4096, 32
    cfg = load_config("configs/experiments/math-1.5b.yaml", [
        "device=cuda", "trainer.dp=1", "trainer.params_dtype=bf16", "trainer.micro_batch_tokens=16384",
        "generator.count=1", "cluster.gpus_per_node=1", "cluster.train_nodes=1", "cluster.rollout_nodes=1",
        "rollout.max_prompt_len=1024", "rollout.max_new_tokens=8192", "total_steps=100",
    ], check_files=False)
    os.environ.setdefault("MASTER_ADDR", "127.0.0.1")
    os.environ.setdefault("MASTER_PORT", "29533")
    init_trainer_world(cfg, 0, 1, "env://")
    engine = TrainEngine(cfg)
    rng = random.Random(0)
    vocab = cfg.model.vocab_size
    times = []
    for step in range(3 if quick else 6):
        batch = [([rng.randrange(vocab) for _ in range(64)], [rng.randrange(vocab) for _ in range(seq_len - 63)])
                 for _ in range(per_step)]
        torch.cuda.synchronize()
        start = time.perf_counter()
        engine.sft_step(batch)
        torch.cuda.synchronize()
        if step > 0:
            times.append(time.perf_counter() - start)
    name = torch.cuda.get_device_name()
    peak = peak_tflops * 1e12 if peak_tflops else next((v for k, v in PEAK_BF16.items() if k in name), None)
    step_s = statistics.median(times)
    tokens = per_step * seq_len
    achieved = tokens * model_flops_per_token(cfg.model, seq_len) / step_s
    return {"device": name, "model": cfg.model.name, "tokens_per_step": tokens, "seq_len": seq_len,
            "step_s": step_s, "tokens_per_s": tokens / step_s, "model_tflops": achieved / 1e12,
            "peak_tflops": peak / 1e12 if peak else None, "mfu": achieved / peak if peak else None}


def table(report: dict) -> str:
    lines = [f"{report['cpus']} CPUs, load average {report['load_average_before']:.1f} before,"
             f" {report['load_average_after']:.1f} after", "",
             "| layout | ranks | tokens/step | step s | tokens/s | CPU s (all ranks) | tokens/CPU s |",
             "|---|---|---|---|---|---|---|"]
    for layout, r in report["cpu"].items():
        lines.append(f"| {layout} (CPU, tiny) | {r['ranks']} | {r['tokens_per_step']:.0f} | {r['step_s']:.3f} |"
                     f" {r['tokens_per_s']:.0f} | {r['cpu_s']:.3f} | {r['tokens_per_cpu_s']:.0f} |")
    gpu = report.get("gpu")
    if gpu:
        mfu = f"{gpu['mfu']:.1%}" if gpu["mfu"] is not None else "peak unknown (--peak-tflops)"
        lines.append(f"\nGPU {gpu['device']}, {gpu['model']}: {gpu['tokens_per_s']:.0f} tokens/s,"
                     f" {gpu['model_tflops']:.1f} TFLOP/s, MFU {mfu}")
    return "\n".join(lines)


def plot(report: dict, path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    cpu = report["cpu"]
    fig, ax = plt.subplots(figsize=(6, 3.5))
    x = range(len(cpu))
    ax.bar([i - 0.2 for i in x], [r["tokens_per_s"] for r in cpu.values()], 0.4, label="tokens / s (wall)")
    ax.bar([i + 0.2 for i in x], [r["tokens_per_cpu_s"] for r in cpu.values()], 0.4, label="tokens / CPU s")
    ax.set_xticks(list(x), list(cpu))
    ax.set_ylabel("tokens per second of a PPO step")
    ax.set_title(f"Tiny Qwen2 on CPU (gloo, 1 thread per rank, load {report['load_average_before']:.0f})")
    ax.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=120)


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if argv and argv[0] == "--cpu-worker":
        cpu_worker(argv[1], argv[2], int(argv[3]), argv[4])
        return 0
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="fewer timed steps")
    parser.add_argument("--out", type=Path, default=Path(__file__).parent / "results")
    parser.add_argument("--peak-tflops", type=float, default=None, help="the GPU's dense bf16 peak")
    args = parser.parse_args(argv)
    # Other work on the machine slows the CPU figures; the 1-minute load average says how much.
    report: dict = {"quick": args.quick, "cpus": os.cpu_count(), "load_average_before": os.getloadavg()[0]}
    report["cpu"] = measure_cpu(args.quick)
    report["load_average_after"] = os.getloadavg()[0]
    from areal_hpc.wire.device import cuda_visible

    if cuda_visible():
        report["gpu"] = measure_gpu(args.quick, args.peak_tflops)
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "train_step.json").write_text(json.dumps(report, indent=2) + "\n")
    plot(report, args.out / "train_step.png")
    print(table(report))
    print(f"wrote {args.out / 'train_step.json'} and {args.out / 'train_step.png'}")
    return 0


if __name__ == "__main__":
    sys.exit(main())

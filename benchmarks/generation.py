"""Generation throughput: the vLLM generator against transformers, and under weight updates.

Measured on the tiny Qwen2 of the CPU profile (configs/experiments/tiny-cpu.yaml):
1. tokens/s of the Generator against transformers `generate` on the same model and batch
   (64 prompts x 4 samples of the arithmetic task, temperature 1, up to 128 new tokens; both on
   one CPU thread, which is what vLLM's CPU worker binds to here);
2. tokens/s of one generator kept full (prompts of 4 samples, up to 256 new tokens, resubmitted
   as they finish) for a fixed window while a checkpoint sender pushes new weights every k
   seconds, in `abort` mode, in `keep` mode, and in `wait` mode (each update waits for every
   in-flight request to finish: the non-interruptible baseline), and with no updates.
   Counted: output tokens of samples that finished inside the window; median of the rounds.
   The paper reports +12-17% for interruptible generation over the non-interruptible baseline.

The numbers depend on the machine's load; the JSON records the load average at the start.

Usage: .venv/bin/python benchmarks/generation.py [--quick] [--out benchmarks/results]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import socket
import sys
import tempfile
import time
from pathlib import Path

from areal_hpc.config.load import load_config
from areal_hpc.data.arithmetic import make_splits
from areal_hpc.data.tiny_model import build_tiny_model
from areal_hpc.rollout.checkpoint_sender import CheckpointSender
from areal_hpc.rollout.generator import Generator
from areal_hpc.wire.messages import GenerateRequest, SamplingParams

CONFIG = "configs/experiments/tiny-cpu.yaml"
GROUP = 4


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def prompts(model_dir: Path, n: int) -> list[list[int]]:
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(str(model_dir))
    problems, _ = make_splits(7, n, 1)
    return [tok(p.prompt)["input_ids"] for p in problems]


def transformers_tokens_per_s(model_dir: Path, batch: list[list[int]], max_new: int) -> dict:
    """Sampled generation with transformers, left-padded batch, `GROUP` samples per prompt."""
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    torch.set_num_threads(1)
    tok = AutoTokenizer.from_pretrained(str(model_dir))
    model = AutoModelForCausalLM.from_pretrained(str(model_dir), dtype=torch.float32).eval()
    width = max(map(len, batch))
    ids = torch.tensor([[tok.pad_token_id] * (width - len(p)) + p for p in batch])
    mask = torch.tensor([[0] * (width - len(p)) + [1] * len(p) for p in batch])
    torch.manual_seed(0)
    with torch.no_grad():  # warm-up
        model.generate(input_ids=ids[:2], attention_mask=mask[:2], max_new_tokens=4, pad_token_id=tok.pad_token_id)
    start = time.perf_counter()
    with torch.no_grad():
        out = model.generate(input_ids=ids, attention_mask=mask, do_sample=True, temperature=1.0, top_k=0,
                             max_new_tokens=max_new, num_return_sequences=GROUP,
                             pad_token_id=tok.pad_token_id, eos_token_id=tok.eos_token_id)
    seconds = time.perf_counter() - start
    tokens = 0
    for row in out[:, width:].tolist():
        tokens += row.index(tok.eos_token_id) + 1 if tok.eos_token_id in row else len(row)
    return {"tokens": tokens, "seconds": seconds, "tokens_per_s": tokens / seconds}


async def generator_tokens_per_s(gen: Generator, batch: list[list[int]], max_new: int) -> dict:
    gen.submit(GenerateRequest(-1, batch[0], 2, SamplingParams(4, seed=0)))  # warm-up
    while gen.pending:
        await gen.finished()
    start = time.perf_counter()
    for i, p in enumerate(batch):
        gen.submit(GenerateRequest(i, p, GROUP, SamplingParams(max_new, seed=i)))
    tokens = 0
    while gen.pending:
        tokens += len((await gen.finished()).output_ids)
    seconds = time.perf_counter() - start
    return {"tokens": tokens, "seconds": seconds, "tokens_per_s": tokens / seconds}


async def loaded_run(gen: Generator, sender: CheckpointSender | None, model_dir: Path, pool: list[list[int]],
                     window: float, every: float | None, in_flight: int, max_new: int) -> dict:
    """Keep `in_flight` samples running for `window` seconds, updating weights every `every` s."""
    counter = iter(range(10**9))

    def refill() -> None:
        while gen.pending + GROUP <= in_flight:
            i = next(counter)
            gen.submit(GenerateRequest(i, pool[i % len(pool)], GROUP, SamplingParams(max_new, seed=i)))

    async def update_every() -> None:
        while True:
            try:
                await asyncio.wait_for(stop.wait(), every)
                return
            except TimeoutError:
                pass
            version = gen.version + 1
            sender.send(version, model_dir)
            update = await gen.update_weights(version)
            await asyncio.to_thread(sender.result)
            pauses.append(update.seconds)

    stop = asyncio.Event()
    pauses: list[float] = []
    tokens = samples = interrupted = 0
    refill()
    start = time.perf_counter()
    updater = asyncio.create_task(update_every()) if every else None
    while (left := start + window - time.perf_counter()) > 0:
        try:
            t = await asyncio.wait_for(gen.finished(), left)
        except TimeoutError:
            break
        tokens += len(t.output_ids)
        samples += 1
        interrupted += len(set(t.versions)) > 1
        refill()
    if updater is not None:  # let an update in progress finish: the sender is in step with it
        stop.set()
        await updater
    while gen.pending:  # drain before the next run; not counted
        await gen.finished()
    return {"tokens": tokens, "samples": samples, "interrupted_samples": interrupted, "window_s": window,
            "tokens_per_s": tokens / window, "updates": len(pauses),
            "mean_pause_s": sum(pauses) / len(pauses) if pauses else 0.0,
            "max_pause_s": max(pauses, default=0.0)}


async def interrupt_modes(model_dir: Path, pool: list[list[int]], window: float, intervals: list[float],
                          max_new: int, rounds: int) -> dict:
    """One generator per mode, all started first; runs interleaved in rounds (median per run),
    so that other load on the machine shifts every mode alike."""
    gens: dict[str, tuple[Generator, CheckpointSender]] = {}
    samples: dict[str, list[dict]] = {}
    try:
        for mode in ("abort", "keep", "wait"):
            cfg = load_config(CONFIG)
            cfg.generator.interrupt_mode = mode
            port = free_port()
            gens[mode] = (Generator(cfg, model_dir), CheckpointSender("127.0.0.1", port, 2))
            await gens[mode][0].start()
            await gens[mode][0].init_weight_group("127.0.0.1", port, 2, 1)
        in_flight = load_config(CONFIG).generator.max_num_seqs
        plan = [("none", "abort", None)] + [(f"{m} k={k:g}s", m, k) for k in intervals for m in gens]
        for r in range(rounds):
            for name, mode, every in plan:
                gen, sender = gens[mode]
                run = await loaded_run(gen, sender, model_dir, pool, window, every, in_flight, max_new)
                samples.setdefault(name, []).append({**run, "mode": mode if every else "none", "every_s": every})
                print(f"  round {r + 1}, {name}: {run['tokens_per_s']:.0f} tokens/s, {run['updates']} updates, "
                      f"mean pause {run['mean_pause_s']:.2f} s", flush=True)
    finally:
        for gen, sender in gens.values():
            await gen.shutdown()
            sender.close()
    runs = {}
    for name, rs in samples.items():
        median = sorted(rs, key=lambda r: r["tokens_per_s"])[len(rs) // 2]
        runs[name] = {**median, "rounds_tokens_per_s": [r["tokens_per_s"] for r in rs]}
    return runs


async def measure(quick: bool) -> dict:
    load = os.getloadavg()[0]
    cfg = load_config(CONFIG)
    n_prompts, max_new = (16, 64) if quick else (64, 128)
    window, intervals, rounds = (15.0, [4.0], 1) if quick else (30.0, [2.0, 6.0], 3)
    with tempfile.TemporaryDirectory() as tmp:
        model_dir = build_tiny_model(cfg.model, Path(tmp) / "tiny", seed=0)
        batch = prompts(model_dir, n_prompts)
        print(f"transformers generate, {n_prompts} prompts x {GROUP} samples ...", flush=True)
        hf = transformers_tokens_per_s(model_dir, batch, max_new)
        gen = Generator(cfg, model_dir)
        print("vLLM generator, same batch ...", flush=True)
        try:
            await gen.start()
            ours = await generator_tokens_per_s(gen, batch, max_new)
        finally:
            await gen.shutdown()
        print("throughput under weight updates ...", flush=True)
        loaded = await interrupt_modes(model_dir, prompts(model_dir, 256), window, intervals, 2 * max_new, rounds)
    gains = {}
    for every in intervals:
        wait = loaded[f"wait k={every:g}s"]["tokens_per_s"]
        for mode in ("abort", "keep"):
            gains[f"{mode} vs wait, k={every:g}s"] = loaded[f"{mode} k={every:g}s"]["tokens_per_s"] / wait - 1
    return {
        "quick": quick, "load_average": load, "prompts": n_prompts, "group": GROUP,
        "max_new_tokens": max_new, "transformers": hf, "generator": ours,
        "speedup_over_transformers": ours["tokens_per_s"] / hf["tokens_per_s"],
        "under_updates": loaded, "interruptible_gain": gains,
    }


def table(report: dict) -> str:
    hf, ours = report["transformers"], report["generator"]
    lines = [
        f"Batch: {report['prompts']} prompts x {report['group']} samples, up to {report['max_new_tokens']} new tokens",
        "| engine | tokens | seconds | tokens/s |", "|---|---|---|---|",
        f"| transformers generate | {hf['tokens']} | {hf['seconds']:.1f} | {hf['tokens_per_s']:.0f} |",
        f"| vLLM generator | {ours['tokens']} | {ours['seconds']:.1f} | {ours['tokens_per_s']:.0f} |",
        f"speed-up: {report['speedup_over_transformers']:.1f}x", "",
        "| run | tokens/s | samples | interrupted | updates | mean pause s | max pause s |",
        "|---|---|---|---|---|---|---|",
    ]
    for name, r in report["under_updates"].items():
        lines.append(f"| {name} | {r['tokens_per_s']:.0f} | {r['samples']} | {r['interrupted_samples']} |"
                     f" {r['updates']} | {r['mean_pause_s']:.2f} | {r['max_pause_s']:.2f} |")
    lines.append("")
    lines += [f"{k}: {v:+.1%}" for k, v in report["interruptible_gain"].items()]
    return "\n".join(lines)


def plot(report: dict, path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (ax1, ax2) = plt.subplots(1, 2, figsize=(11, 4), gridspec_kw={"width_ratios": [1, 2]})
    ax1.bar(["transformers", "vLLM generator"],
            [report["transformers"]["tokens_per_s"], report["generator"]["tokens_per_s"]], color=["gray", "C0"])
    ax1.set_ylabel("tokens/s")
    ax1.set_title(f"{report['prompts']} prompts x {report['group']} samples")
    runs = report["under_updates"]
    colors = {"none": "gray", "abort": "C0", "keep": "C1", "wait": "C3"}
    names = list(runs)
    ax2.bar(names, [runs[n]["tokens_per_s"] for n in names],
            color=[colors[runs[n].get("mode", "none")] for n in names])
    ax2.set_ylabel("tokens/s (samples finished in the window)")
    ax2.set_title("kept full while weights update every k s")
    ax2.tick_params(axis="x", rotation=30)
    fig.suptitle("Generation throughput, tiny Qwen2 on CPU" + (" (--quick)" if report["quick"] else ""))
    fig.tight_layout()
    fig.savefig(path, dpi=120)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="16 prompts, 15 s windows, one interval, one round")
    parser.add_argument("--out", type=Path, default=Path(__file__).parent / "results")
    args = parser.parse_args(argv)
    report = asyncio.run(measure(args.quick))
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "generation.json").write_text(json.dumps(report, indent=2) + "\n")
    plot(report, args.out / "generation.png")
    print(table(report))
    print(f"wrote {args.out / 'generation.json'} and {args.out / 'generation.png'}")
    return 0


if __name__ == "__main__":
    sys.exit(main())

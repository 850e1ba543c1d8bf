"""What the strict staleness gate costs: the strict and AReaL's admission-only training gate side by side.

rollout.staleness_gate "strict" holds a complete batch until no prompt still generating would be
trained more than eta versions after it started (trained staleness exactly <= eta); "admission"
(AReaL's rule) trains every complete batch at once and bounds only when prompts may start, so a
straggler can be trained older than eta. Two measurements, each gate against the other in one run
of this script:

1. Real jobs on this machine: the quickstart experiment's three ranks (controller, Megatron
   trainer, vLLM generator; 32 prompts x 16 samples per step) from the same warm-started model
   and prompts, for eta in {1, 2, 4} x both gates. A gate can cost only where generation is the
   slower side and stragglers exist, as in the paper's runs (the simulator's trainers idle ~90%).
   The quickstart's own mix is neither here (responses average 20 tokens and the trainer is
   never idle), so these runs use a long-tailed mix (90% one-operation problems, 10% of 16
   operations, up to 512 new tokens) and make generation the slower side (32 sequences decoded
   at once instead of 128, one PPO minibatch). Effective throughput is trained tokens
   per wall second, the median over the steps after the first; staleness is the trained
   batches' (policy version minus a trajectory's oldest token version).
2. The cluster simulator, which runs the controller's own Scheduler, at the paper's scale:
   1.5B on 128 GPUs and 7B on 256 GPUs, 32k context, eta in {1, 2, 4, 8}.

Writes staleness_gate.json and .png under --out and prints both tables.
Usage: .venv/bin/python benchmarks/staleness_gate.py [--quick] [--steps N] [--out benchmarks/results]
"""

from __future__ import annotations

import argparse
import json
import random
import tempfile
from pathlib import Path
from statistics import mean, median

import rl_runs

from areal_hpc.data.arithmetic import make_problem
from areal_hpc.sim import predict

GATES = ("strict", "admission")
ETAS = (1, 2, 4)
QUICK_ETAS = (1,)
# (model size, GPUs): the paper's 32k-context staleness sweeps.
SIM_POINTS = (("1.5b", 128), ("7b", 256))
SIM_ETAS = (1, 2, 4, 8)
SIM_CONTEXT = 32768
# The CPU runs' long-tailed prompt mix and generation cap (see long_tail_prompts).
LONG_OPS, LONG_SHARE, MAX_NEW_TOKENS = 16, 0.1, 512
# Sequences the engine decodes at once: fewer than the quickstart's 128, so that generation, not
# training, is the slower side, as on the paper's clusters.
MAX_NUM_SEQS = 32


def long_tail_prompts(path: Path, rows: int, seed: int = 0) -> Path:
    """Arithmetic prompts whose solutions are long-tailed like reasoning traces: most take one
    operation (a few tokens), LONG_SHARE take LONG_OPS (the warm-started model writes hundreds of
    tokens for them, many up to the generation cap)."""
    rng = random.Random(seed)
    with path.open("w") as f:
        for _ in range(rows):
            p = make_problem(rng, n_ops=LONG_OPS if rng.random() < LONG_SHARE else 1)
            f.write(json.dumps({"prompt": p.prompt, "answer": p.answer}) + "\n")
    return path


def measure_real(etas: tuple[int, ...], total_steps: int, model: Path, work: Path) -> list[dict]:
    prompts = long_tail_prompts(work / "long_tail.jsonl", 4096)
    rows = []
    for eta in etas:
        for gate in GATES:
            records, wall = rl_runs.run(work / f"eta{eta}-{gate}", [
                f"model.path={model}", f"rollout.eta={eta}", f"rollout.staleness_gate={gate}",
                f"total_steps={total_steps}", f"data.train_path={prompts}", "data.synthetic_eval_size=1",
                f"rollout.max_new_tokens={MAX_NEW_TOKENS}", f"generator.max_num_seqs={MAX_NUM_SEQS}",
                "ppo.minibatches=1", "eval_interval=0",
                "checkpoint.interval_steps=0",
            ])
            s = rl_runs.steps(records)
            later = s[1:]
            rows.append({
                "eta": eta, "gate": gate,
                "effective_tokens_per_s": median(r["effective_tokens_per_s"] for r in later),
                "step_s": median(r["step_s"] for r in later),
                "staleness_max": max(r["staleness_max"] for r in s),
                "staleness_mean": mean(r["staleness_mean"] for r in s),
                "beyond_eta_fraction": sum(c for r in s for k, c in r.items()
                                           if k.startswith("staleness_hist/") and int(k.split("/")[1]) > eta)
                / sum(c for r in s for k, c in r.items() if k.startswith("staleness_hist/")),
                "trainer_idle_fraction": mean(r["trainer_idle_fraction"] for r in later),
                "response_len_mean": mean(r["response_len_mean"] for r in s),
                "response_len_max": max(r["response_len_max"] for r in s),
                "job_s": wall,
            })
            r = rows[-1]
            print(f"eta={eta} {gate}: {r['effective_tokens_per_s']:.0f} trained tok/s,"
                  f" max staleness {r['staleness_max']:.0f}", flush=True)
    return rows


def measure_sim(quick: bool) -> list[dict]:
    fidelity = predict.QUICK if quick else predict.DEFAULT
    rows = []
    for model, gpus in SIM_POINTS:
        for gate in GATES:
            for eta, p in zip(SIM_ETAS, predict.staleness(model, gpus, list(SIM_ETAS), SIM_CONTEXT,
                                                           fidelity=fidelity, gate=gate), strict=True):
                rows.append({"model": model, "gpus": gpus, "eta": eta, "gate": gate,
                             "tokens_per_s": p.tokens_per_s, "staleness_max": p.run.max_staleness,
                             "trainer_idle_fraction": p.run.train_idle})
    return rows


def _ratio(rows: list[dict], key: str, **where) -> float:
    pick = {r["gate"]: r[key] for r in rows if all(r[k] == v for k, v in where.items())}
    return pick["admission"] / pick["strict"]


def table(report: dict) -> str:
    real = report["real"]
    lines = ["| eta | gate | effective tok/s | admission / strict | step s | max staleness | mean staleness |"
             " trained beyond eta | trainer idle |",
             "|---|---|---|---|---|---|---|---|---|"]
    for r in real:
        ratio = f"{_ratio(real, 'effective_tokens_per_s', eta=r['eta']):.2f}" if r["gate"] == "admission" else ""
        lines.append(f"| {r['eta']} | {r['gate']} | {r['effective_tokens_per_s']:.0f} | {ratio} | {r['step_s']:.2f} |"
                     f" {r['staleness_max']:.0f} | {r['staleness_mean']:.2f} | {r['beyond_eta_fraction']:.1%} |"
                     f" {r['trainer_idle_fraction']:.2f} |")
    lengths = f"{mean(r['response_len_mean'] for r in real):.0f}"
    lines.append(f"\nresponse length: mean {lengths} tokens, longest {max(r['response_len_max'] for r in real):.0f}")
    lines += ["", "| model | GPUs | eta | strict tok/s | admission tok/s | admission / strict |"
              " max staleness strict | max staleness admission |", "|---|---|---|---|---|---|---|---|"]
    sim = report["sim"]
    for model, gpus in SIM_POINTS:
        for eta in SIM_ETAS:
            pick = {r["gate"]: r for r in sim if (r["model"], r["gpus"], r["eta"]) == (model, gpus, eta)}
            s, a = pick["strict"], pick["admission"]
            lines.append(f"| {model} | {gpus} | {eta} | {s['tokens_per_s'] / 1e3:.1f}k | {a['tokens_per_s'] / 1e3:.1f}k |"
                         f" {a['tokens_per_s'] / s['tokens_per_s']:.2f} | {s['staleness_max']} | {a['staleness_max']} |")
    return "\n".join(lines)


def plot(report: dict, path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, 3, figsize=(13, 4))
    real = report["real"]
    etas = sorted({r["eta"] for r in real})
    width = 0.38
    for i, gate in enumerate(GATES):
        rows = {r["eta"]: r for r in real if r["gate"] == gate}
        xs = [k + (i - 0.5) * width for k in range(len(etas))]
        axes[0].bar(xs, [rows[e]["effective_tokens_per_s"] for e in etas], width, label=gate, color=f"C{i}")
        axes[1].bar(xs, [rows[e]["staleness_max"] for e in etas], width, label=gate, color=f"C{i}")
    for ax, label in ((axes[0], "effective throughput (trained tokens/s)"), (axes[1], "max trained staleness")):
        ax.set_xticks(range(len(etas)), [str(e) for e in etas])
        ax.set_xlabel("staleness bound eta")
        ax.set_ylabel(label)
        ax.legend()
    axes[0].set_title("CPU miniature (quickstart job)", fontsize=10)
    axes[1].plot(range(len(etas)), etas, "k--", lw=1, label="eta")
    axes[1].set_title("CPU miniature: staleness the gate lets through", fontsize=10)
    for j, (model, gpus) in enumerate(SIM_POINTS):
        ratios = [_ratio(report["sim"], "tokens_per_s", model=model, gpus=gpus, eta=e) for e in SIM_ETAS]
        axes[2].plot(SIM_ETAS, ratios, "o-", color=f"C{j + 2}", label=f"{model}, {gpus} GPUs (simulated)")
    axes[2].axhline(1.0, color="k", lw=0.8)
    axes[2].set_xscale("log", base=2)
    axes[2].set_xlabel("staleness bound eta")
    axes[2].set_ylabel("throughput, admission / strict")
    axes[2].set_title(f"Cluster simulator, {SIM_CONTEXT // 1024}k context", fontsize=10)
    axes[2].legend()
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="eta 1 only, fewer steps, quicker simulation")
    parser.add_argument("--steps", type=int, default=None, help="training steps per real run")
    parser.add_argument("--out", type=Path, default=Path(__file__).parent / "results")
    args = parser.parse_args()
    steps = args.steps or (5 if args.quick else 8)
    sim = measure_sim(args.quick)
    model = rl_runs.warm_model()
    with tempfile.TemporaryDirectory() as work:
        real = measure_real(QUICK_ETAS if args.quick else ETAS, steps, model, Path(work))
    report = {"real": real, "sim": sim, "steps": steps, "quick": args.quick}
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "staleness_gate.json").write_text(json.dumps(report, indent=1))
    plot(report, args.out / "staleness_gate.png")
    print(table(report))
    print(f"wrote {args.out / 'staleness_gate.json'} and {args.out / 'staleness_gate.png'}")


if __name__ == "__main__":
    main()

"""The paper's Figure 5c in miniature: effective throughput against the staleness bound eta.

Each eta in {0, 1, 2, 4, 8} (--quick: 0 and 4) runs the same job: the quickstart experiment's
three ranks (controller, one Megatron trainer, one vLLM generator; 32 prompts x 16 samples per
step) from the same warm-started model, the same prompts and the same number of steps. Effective throughput = trained tokens per second
of wall time, the median over the steps after the first (the first includes filling the
pipeline; the median keeps a step slowed by other work on the machine from deciding the result).

eta = 0 is synchronous RL: each step generates its batch (G seconds), then trains on it and moves
the weights (T seconds). Perfect overlap of the two would give a step time of max(G, T), so the
ideal speedup of asynchronous RL is (G + T) / max(G, T), with G and T measured in the eta = 0
run. `speedup` is the measured throughput of eta = 4 over eta = 0 and `speedup_over_bound` the
share of the ideal it reaches. Both ranks share this machine's cores, so overlapping generation
and training also slows each down, unlike on separate GPUs.

Writes async_vs_sync.json and .png under --out and prints a table.
Usage: .venv/bin/python benchmarks/async_vs_sync.py [--quick] [--out benchmarks/results]
"""

from __future__ import annotations

import argparse
import json
import tempfile
from pathlib import Path
from statistics import mean, median

import rl_runs

ETAS = (0, 1, 2, 4, 8)
QUICK_ETAS = (0, 4)


def throughput(step_records: list[dict]) -> float:
    """Median trained tokens per wall second of a step, over the steps after the first."""
    return median(r["effective_tokens_per_s"] for r in step_records[1:])


def sync_times(step_records: list[dict]) -> tuple[float, float]:
    """Median generation time G and training time T (step + weight sync) of a synchronous step."""
    later = step_records[1:]
    t = median(r["train_s"] + r["weight_sync_s"] for r in later)
    return median(r["step_s"] for r in later) - t, t


def measure(etas: tuple[int, ...], total_steps: int, model: Path, work: Path) -> dict:
    rows = {}
    for eta in etas:
        records, wall = rl_runs.run(work / f"eta{eta}", [
            f"model.path={model}", f"rollout.eta={eta}", f"total_steps={total_steps}",
            "data.synthetic_eval_size=1", "eval_interval=0", "checkpoint.interval_steps=0",
        ])
        s = rl_runs.steps(records)
        rows[eta] = {
            "effective_tokens_per_s": throughput(s),
            "generated_tokens_per_s": mean(r["generated_tokens_per_s"] for r in s[1:]),
            "step_s": median(r["step_s"] for r in s[1:]),
            "staleness_max": max(r["staleness_max"] for r in s),
            "trainer_idle_fraction": mean(r["trainer_idle_fraction"] for r in s[1:]),
            "generator_idle_fraction": mean(r["generator_idle_fraction"] for r in s[1:]),
            "job_s": wall,
        }
        print(f"eta={eta}: {rows[eta]['effective_tokens_per_s']:.0f} trained tok/s", flush=True)
        if eta == 0:
            g, t = sync_times(s)
            rows[0].update({"G_s": g, "T_s": t})
    g, t = rows[0]["G_s"], rows[0]["T_s"]
    bound = (g + t) / max(g, t)
    speedup = rows[4]["effective_tokens_per_s"] / rows[0]["effective_tokens_per_s"]
    return {"etas": {str(k): v for k, v in rows.items()}, "G_s": g, "T_s": t, "ideal_speedup": bound,
            "speedup": speedup, "speedup_over_bound": speedup / bound, "steps": total_steps}


def table(report: dict) -> str:
    lines = ["| eta | effective tok/s | generated tok/s | step s | max staleness | trainer idle | generator idle |",
             "|---|---|---|---|---|---|---|"]
    for eta, r in report["etas"].items():
        lines.append(f"| {eta} | {r['effective_tokens_per_s']:.0f} | {r['generated_tokens_per_s']:.0f} |"
                     f" {r['step_s']:.2f} | {r['staleness_max']:.0f} | {r['trainer_idle_fraction']:.2f} |"
                     f" {r['generator_idle_fraction']:.2f} |")
    lines.append(f"\nsynchronous step: G = {report['G_s']:.2f} s generation, T = {report['T_s']:.2f} s training"
                 f" + weight sync; ideal overlap speedup (G+T)/max(G,T) = {report['ideal_speedup']:.2f}")
    lines.append(f"speedup of eta=4 over eta=0: {report['speedup']:.2f}"
                 f" = {report['speedup_over_bound']:.2f} of the ideal")
    return "\n".join(lines)


def plot(report: dict, path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    etas = list(report["etas"])
    values = [report["etas"][e]["effective_tokens_per_s"] for e in etas]
    fig, ax = plt.subplots(figsize=(6, 4))
    ax.bar(etas, values, color=["C7"] + ["C0"] * (len(etas) - 1))
    ideal = report["etas"]["0"]["effective_tokens_per_s"] * report["ideal_speedup"]
    ax.axhline(ideal, color="C3", ls="--", label="eta=0 x ideal overlap (G+T)/max(G,T)")
    ax.set_xlabel("staleness bound eta")
    ax.set_ylabel("effective throughput (trained tokens/s)")
    ax.set_title(f"Async vs sync RL, tiny model on CPU\nspeedup of eta=4: {report['speedup']:.2f}"
                 f" ({report['speedup_over_bound']:.2f} of the ideal)", fontsize=10)
    ax.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="eta 0 and 4 only, fewer steps")
    parser.add_argument("--steps", type=int, default=None, help="training steps per run")
    parser.add_argument("--out", type=Path, default=Path(__file__).parent / "results")
    args = parser.parse_args()
    etas = QUICK_ETAS if args.quick else ETAS
    steps = args.steps or (5 if args.quick else 12)
    model = rl_runs.warm_model()
    with tempfile.TemporaryDirectory() as work:
        report = measure(etas, steps, model, Path(work))
    report["quick"] = args.quick
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "async_vs_sync.json").write_text(json.dumps(report, indent=1))
    plot(report, args.out / "async_vs_sync.png")
    print(table(report))
    print(f"wrote {args.out / 'async_vs_sync.json'} and {args.out / 'async_vs_sync.png'}")


if __name__ == "__main__":
    main()

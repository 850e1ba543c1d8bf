"""What RL does to the tiny model: held-out accuracy before and after, by objective and eta.

Four runs of the quickstart job from the same warm-started model: the decoupled PPO objective on
and off, at eta = 0 (synchronous) and eta = 4. Held-out accuracy is avg@k (k = rollout.group_size
samples per held-out prompt at the rollout temperature, the same seeds before and after), as the
paper reports avg@32. With one seed per configuration the differences between runs are within
noise unless they are large; the table says what was measured, nothing is tuned to a target.

Writes quickstart_quality.json and .png under --out and prints a table.
Usage: .venv/bin/python benchmarks/quickstart_quality.py [--quick] [--out benchmarks/results]
"""

from __future__ import annotations

import argparse
import json
import math
import tempfile
from pathlib import Path

import rl_runs

RUNS = [(eta, decoupled) for eta in (0, 4) for decoupled in (True, False)]


def standard_error(p: float, n: int) -> float:
    return math.sqrt(max(p * (1 - p), 1e-12) / n)


def measure(total_steps: int, eval_prompts: int, model: Path, work: Path) -> dict:
    rows = []
    for eta, decoupled in RUNS:
        records, wall = rl_runs.run(work / f"eta{eta}-{'dec' if decoupled else 'std'}", [
            f"model.path={model}", f"rollout.eta={eta}", f"ppo.decoupled={str(decoupled).lower()}",
            f"total_steps={total_steps}", f"data.synthetic_eval_size={eval_prompts}",
            "checkpoint.interval_steps=0", "eval_interval=0",
        ])
        ev, st = rl_runs.evals(records), rl_runs.steps(records)
        row = {
            "eta": eta, "decoupled": decoupled, "before": ev[0]["eval_accuracy"], "after": ev[-1]["eval_accuracy"],
            "reward_first": st[0]["reward_mean"], "reward_last_mean3": sum(r["reward_mean"] for r in st[-3:]) / 3,
            "max_staleness": max(r["staleness_max"] for r in st), "job_s": wall,
        }
        rows.append(row)
        print(f"eta={eta} decoupled={decoupled}: held-out {row['before']:.3f} -> {row['after']:.3f}", flush=True)
    return {"runs": rows, "steps": total_steps, "eval_prompts": eval_prompts}


def table(report: dict, samples: int) -> str:
    lines = ["| eta | objective | held-out before | held-out after | change | reward, step 1 | reward, last 3 | max staleness |",
             "|---|---|---|---|---|---|---|---|"]
    for r in report["runs"]:
        se = standard_error(r["before"], samples)
        lines.append(f"| {r['eta']} | {'decoupled' if r['decoupled'] else 'standard PPO'} | {r['before']:.3f} |"
                     f" {r['after']:.3f} | {r['after'] - r['before']:+.3f} (se {se:.3f}) | {r['reward_first']:+.2f} |"
                     f" {r['reward_last_mean3']:+.2f} | {r['max_staleness']:.0f} |")
    return "\n".join(lines)


def plot(report: dict, path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    runs = report["runs"]
    labels = [f"eta={r['eta']}\n{'decoupled' if r['decoupled'] else 'standard'}" for r in runs]
    x = range(len(runs))
    fig, ax = plt.subplots(figsize=(7, 4))
    ax.bar([i - 0.2 for i in x], [r["before"] for r in runs], 0.4, label="before RL", color="C7")
    ax.bar([i + 0.2 for i in x], [r["after"] for r in runs], 0.4, label=f"after {report['steps']} RL steps")
    ax.set_xticks(list(x), labels)
    ax.set_ylabel("held-out accuracy (avg@k)")
    ax.set_title("Tiny model on the arithmetic task")
    ax.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="fewer steps and held-out prompts")
    parser.add_argument("--out", type=Path, default=Path(__file__).parent / "results")
    args = parser.parse_args()
    steps, prompts = (8, 64) if args.quick else (20, 128)
    model = rl_runs.warm_model()
    with tempfile.TemporaryDirectory() as work:
        report = measure(steps, prompts, model, Path(work))
    report["quick"] = args.quick
    group = rl_runs.load_config(rl_runs.CONFIG).rollout.group_size
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "quickstart_quality.json").write_text(json.dumps(report, indent=1))
    plot(report, args.out / "quickstart_quality.png")
    print(table(report, prompts * group))
    print(f"wrote {args.out / 'quickstart_quality.json'} and {args.out / 'quickstart_quality.png'}")


if __name__ == "__main__":
    main()

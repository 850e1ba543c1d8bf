"""The quickstart as a new user meets it: does the tiny model visibly learn, and how long does it take?

Runs exactly what `make quickstart` runs, timed: the warm start (in an empty model cache, as on a
fresh clone, unless --reuse-model) and the RL job of configs/experiments/quickstart.yaml (or, with
--config configs/experiments/quickstart-code.yaml, what `make quickstart-code` runs). Records
the held-out curve (avg@n and pass@n at every evaluation, the same prompts and sampling seeds at
each), the training reward per step and its moving average, and the paired gain with its standard
error from the run's summary. The bar: a gain of at least 0.20 within 8 minutes, warm start included.

Writes <config name>_quality.json and .png under --out (quickstart_quality.json,
quickstart_code_quality.json) and prints a table.
Usage: .venv/bin/python benchmarks/quickstart_quality.py [--config FILE] [--reuse-model] [--out DIR]
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import rl_runs

from areal_hpc.recipes.warm_start import CACHE_ENV

# Steps averaged by the smoothed training-reward curve.
SMOOTHING = 10
# What each quickstart must reach: held-out gain and wall-clock minutes, warm start included.
TARGET_GAIN = 0.20
TARGET_MINUTES = 8.0


def moving_average(values: list[float], window: int) -> list[float]:
    """The mean of each value and up to window - 1 before it."""
    return [sum(values[max(0, i - window + 1): i + 1]) / (i + 1 - max(0, i - window + 1)) for i in range(len(values))]


def summarize(records: list[dict], summary: dict, warm_start_s: float, run_s: float, name: str) -> dict:
    """The report's values from the run's metrics records and summary.json (pure)."""
    evals = rl_runs.evals(records)
    steps = rl_runs.steps(records)
    pass_key = max((k for k in evals[0] if k.startswith("eval_pass@")), key=lambda k: int(k.split("@")[1]))
    rewards = [r["reward_mean"] for r in steps]
    smooth = moving_average(rewards, SMOOTHING)
    total_min = (warm_start_s + run_s) / 60
    return {
        "name": name,
        "held_out": [{"version": r["step"], "accuracy": r["eval_accuracy"], pass_key: r[pass_key]} for r in evals],
        "reward": rewards, "reward_smoothed": smooth, "smoothing": SMOOTHING,
        "before": summary["eval_accuracy_first"], "after": summary["eval_accuracy_last"],
        "gain": summary["eval_gain"], "gain_stderr": summary["eval_gain_stderr"],
        "warm_start_s": warm_start_s, "run_s": run_s, "total_min": total_min,
        "meets_target": summary["eval_gain"] >= TARGET_GAIN and total_min <= TARGET_MINUTES,
    }


def table(report: dict) -> str:
    pass_key = next(k for k in report["held_out"][0] if k.startswith("eval_pass@"))
    lines = [f"| version | held-out accuracy | {pass_key[5:]} |", "|---|---|---|"]
    lines += [f"| {r['version']} | {r['accuracy']:.3f} | {r[pass_key]:.3f} |" for r in report["held_out"]]
    s = report["reward_smoothed"]
    lines += ["", f"gain {report['gain']:+.3f} +- {report['gain_stderr']:.3f} s.e. (paired), smoothed training reward"
                  f" {s[0]:+.2f} -> {s[-1]:+.2f}; warm start {report['warm_start_s'] / 60:.1f} min + RL job"
                  f" {report['run_s'] / 60:.1f} min = {report['total_min']:.1f} min;"
                  f" target (gain >= {TARGET_GAIN}, <= {TARGET_MINUTES:.0f} min) {'met' if report['meets_target'] else 'NOT met'}"]
    return "\n".join(lines)


def plot(report: dict, path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    pass_key = next(k for k in report["held_out"][0] if k.startswith("eval_pass@"))
    fig, (left, right) = plt.subplots(1, 2, figsize=(10, 4))
    versions = [r["version"] for r in report["held_out"]]
    left.plot(versions, [r["accuracy"] for r in report["held_out"]], "o-", label="held-out accuracy (avg@n)")
    left.plot(versions, [r[pass_key] for r in report["held_out"]], "s--", color="C7", label=pass_key[5:])
    left.set_xlabel("version (training steps)")
    left.set_ylim(0, 1)
    left.legend()
    left.set_title(f"held-out: {report['before']:.3f} -> {report['after']:.3f} ({report['gain']:+.3f})")
    steps = range(1, len(report["reward"]) + 1)
    right.plot(steps, report["reward"], color="C7", alpha=0.5, label="training reward")
    right.plot(steps, report["reward_smoothed"], color="C1", label=f"moving average of {report['smoothing']}")
    right.set_xlabel("step")
    right.legend()
    right.set_title("training reward")
    fig.suptitle(f"make {report['name']}: {report['total_min']:.1f} min on this machine, warm start included")
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--reuse-model", action="store_true",
                        help="use the cached warm-started model (its warm start is then not timed)")
    parser.add_argument("--config", default=rl_runs.CONFIG, help="the quickstart's experiment config")
    parser.add_argument("--out", type=Path, default=Path(__file__).parent / "results")
    args = parser.parse_args()
    name = Path(args.config).stem
    with tempfile.TemporaryDirectory() as work:
        env = dict(os.environ) if args.reuse_model else {**os.environ, CACHE_ENV: str(Path(work) / "cache")}
        start = time.monotonic()
        model = subprocess.run([sys.executable, "-m", "areal_hpc.recipes.warm_start", args.config], env=env,
                               check=True, capture_output=True, text=True).stdout.strip().splitlines()[-1]
        warm_start_s = 0.0 if args.reuse_model else time.monotonic() - start
        run_dir = Path(work) / "run"
        records, run_s = rl_runs.run(run_dir, [f"model.path={model}"], config=args.config)
        summary = json.loads((run_dir / "summary.json").read_text())
    report = summarize(records, summary, warm_start_s, run_s, name)
    report.update(config=args.config, reuse_model=args.reuse_model)
    args.out.mkdir(parents=True, exist_ok=True)
    stem = args.out / f"{name.replace('-', '_')}_quality"
    stem.with_suffix(".json").write_text(json.dumps(report, indent=1))
    plot(report, stem.with_suffix(".png"))
    print(table(report))
    print(f"wrote {stem.with_suffix('.json')} and {stem.with_suffix('.png')}")


if __name__ == "__main__":
    main()

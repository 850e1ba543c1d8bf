"""The end of a run: a summary table on the terminal and a PNG of reward and throughput."""

from __future__ import annotations

import json
import math
from dataclasses import dataclass
from pathlib import Path
from statistics import mean

SUMMARY_FILE = "summary.json"
PLOT_FILE = "summary.png"


def _mean(records: list[dict], key: str, skip_first: bool = False) -> float | None:
    values = [r[key] for r in records if key in r]
    if skip_first and len(values) > 1:  # the first step includes filling the pipeline
        values = values[1:]
    return mean(values) if values else None


def summarize(records: list[dict]) -> dict[str, float | None]:
    """Headline numbers of a run from its metrics records (pure)."""
    steps = [r for r in records if "trained_tokens" in r]
    evals = [r for r in records if "eval_accuracy" in r]
    hist: dict[str, float] = {}
    for r in steps:
        for k, v in r.items():
            if k.startswith("staleness_hist/"):
                hist[k] = hist.get(k, 0.0) + v
    out = {
        "steps": float(steps[-1]["step"]) if steps else 0.0,
        "wall_s": steps[-1].get("elapsed_s") if steps else None,
        "eval_accuracy_first": evals[0]["eval_accuracy"] if evals else None,
        "eval_accuracy_last": evals[-1]["eval_accuracy"] if evals else None,
        "reward_mean_first": steps[0]["reward_mean"] if steps else None,
        "reward_mean_last": steps[-1]["reward_mean"] if steps else None,
        "effective_tokens_per_s": _mean(steps, "effective_tokens_per_s", skip_first=True),
        "generated_tokens_per_s": _mean(steps, "generated_tokens_per_s", skip_first=True),
        "weight_sync_s": _mean(steps, "weight_sync_s"),
        "trainer_idle_fraction": _mean(steps, "trainer_idle_fraction", skip_first=True),
        "generator_idle_fraction": _mean(steps, "generator_idle_fraction", skip_first=True),
        "staleness_max": max((r["staleness_max"] for r in steps), default=None),
        # Generators at the first and the last step; they differ after a loss (docs/fault-tolerance.md).
        "generators_first": steps[0].get("generators_alive") if steps else None,
        "generators_last": steps[-1].get("generators_alive") if steps else None,
    }
    out.update(dict(sorted(hist.items())))
    return out


LABELS = {
    "steps": "training steps",
    "wall_s": "wall time (s)",
    "eval_accuracy_first": "held-out accuracy, start",
    "eval_accuracy_last": "held-out accuracy, end",
    "reward_mean_first": "reward mean, first step",
    "reward_mean_last": "reward mean, last step",
    "effective_tokens_per_s": "effective throughput (trained tok/s)",
    "generated_tokens_per_s": "generation throughput (tok/s)",
    "weight_sync_s": "weight sync (s/step)",
    "trainer_idle_fraction": "trainer idle fraction",
    "generator_idle_fraction": "generator idle fraction",
    "staleness_max": "max staleness trained",
    "generators_first": "generators alive, first step",
    "generators_last": "generators alive, last step",
    "eval_gain": "held-out accuracy gain",
    "eval_gain_stderr": "its standard error (paired)",
}


def print_table(summary: dict[str, float | None], title: str) -> None:
    from rich.console import Console
    from rich.table import Table

    table = Table(title=title)
    table.add_column("metric")
    table.add_column("value", justify="right")
    for key, value in summary.items():
        label = LABELS.get(key, key.replace("staleness_hist/", "trajectories with staleness "))
        table.add_row(label, "-" if value is None else f"{value:.4g}")
    Console(stderr=True).print(table)


def plot(records: list[dict], path: str | Path, title: str) -> Path:
    """Training reward, held-out accuracy and throughput of a run."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    steps = [r for r in records if "trained_tokens" in r]
    evals = [r for r in records if "eval_accuracy" in r]
    fig, (ax1, ax2, ax3) = plt.subplots(1, 3, figsize=(15, 4))
    ax1.plot([r["step"] for r in steps], [r["reward_mean"] for r in steps], label="reward mean")
    ax1.set_xlabel("step")
    ax1.set_ylabel("reward of the trained batch")
    ax1.set_title("training")
    ax2.plot([r["step"] for r in evals], [r["eval_accuracy"] for r in evals], "C2o-")
    ax2.set_xlabel("policy version")
    ax2.set_ylabel("accuracy")
    ax2.set_title("held-out accuracy")
    ax3.plot([r["elapsed_s"] for r in steps], [r["effective_tokens_per_s"] for r in steps], label="effective (trained)")
    ax3.plot([r["elapsed_s"] for r in steps], [r["generated_tokens_per_s"] for r in steps], label="generated")
    ax3.set_xlabel("wall time (s)")
    ax3.set_ylabel("tokens / s")
    ax3.set_title("throughput")
    ax3.legend()
    fig.suptitle(title)
    fig.tight_layout()
    path = Path(path)
    fig.savefig(path, dpi=100)
    plt.close(fig)
    return path


@dataclass(frozen=True)
class Gain:
    """Held-out accuracy before and after, with the standard error of the paired difference: every
    prompt is evaluated with the same seeds at both ends, so prompt difficulty cancels out."""

    first: float
    last: float
    stderr: float
    prompts: int

    @property
    def gain(self) -> float:
        return self.last - self.first


def paired_gain(first: dict[int, float], last: dict[int, float]) -> Gain | None:
    """From each held-out prompt's accuracy at the first and the last evaluation (pure)."""
    rows = sorted(first.keys() & last.keys())
    if len(rows) < 2:
        return None
    diffs = [last[r] - first[r] for r in rows]
    mu = mean(diffs)
    var = sum((d - mu) ** 2 for d in diffs) / (len(diffs) - 1)
    return Gain(mean(first[r] for r in rows), mean(last[r] for r in rows), math.sqrt(var / len(rows)), len(rows))


def verdict(g: Gain | None) -> str:
    """One sentence: did held-out accuracy rise beyond its standard error?"""
    if g is None:
        return "Held-out accuracy was not evaluated at two versions, so no verdict on learning."
    change = f"from {g.first:.3f} to {g.last:.3f} ({g.gain:+.3f} +- {g.stderr:.3f} s.e., {g.prompts} prompts paired)"
    if g.gain > g.stderr:
        return f"Held-out accuracy rose {change}: beyond its standard error."
    if g.gain < -g.stderr:
        return f"Held-out accuracy fell {change}: beyond its standard error."
    return f"Held-out accuracy went {change}: within its standard error, no clear change."


def eval_accuracies(eval_dir: Path) -> list[dict[int, float]]:
    """Per evaluation file (eval/version-NNNNNN.jsonl, in version order): each row's accuracy, the
    share of its samples judged correct (rows of a file written before "correct" was are left out)."""
    out = []
    for path in sorted(eval_dir.glob("version-*.jsonl")):
        rows = [json.loads(line) for line in path.read_text().splitlines() if line.strip()]
        out.append({r["row"]: mean(r["correct"]) for r in rows if r.get("correct")})
    return out


def finish(run_dir: str | Path, records: list[dict], title: str) -> tuple[dict, Path]:
    """Write summary.json and summary.png into the run directory, print the table and the verdict."""
    run_dir = Path(run_dir)
    summary = summarize(records)
    evals = eval_accuracies(run_dir / "eval")
    gain = paired_gain(evals[0], evals[-1]) if len(evals) >= 2 else None
    if gain is not None:
        summary.update(eval_gain=gain.gain, eval_gain_stderr=gain.stderr)
    (run_dir / SUMMARY_FILE).write_text(json.dumps(summary, indent=1))
    print_table(summary, title)
    print(verdict(gain), flush=True)
    return summary, plot(records, run_dir / PLOT_FILE, title)

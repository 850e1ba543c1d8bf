"""Dynamic micro-batch allocation (Algorithm 1) against fixed-size padded micro-batches.

For batches whose lengths look like reasoning traces (long-tailed outputs up to the generation
limit, some truncated at it), a training step is split as the trainer splits it: into PPO
minibatches, each into one token-balanced share per data-parallel rank, each share into
micro-batches under the token budget. Measured per mix:
- microbatches_over_lower_bound: micro-batches used / ceil(tokens / budget), summed over all
  (minibatch, DP rank) shares: how close Algorithm 1 gets to the fewest possible passes;
- padding_fraction: padding tokens / tokens computed (Algorithm 1 packs without padding);
- dp_imbalance: the largest share's tokens / the mean share's, worst minibatch;
- budget_fill: real tokens / (micro-batches x budget), how full the passes are.
The baseline takes a fixed number of sequences per micro-batch, as many as fit the budget at the
maximum length, in arrival order, padded to the longest of each micro-batch.
Top-level JSON values are the worst over the mixes. Goals: <= 1.05, 0.0, <= 1.02.

Usage: .venv/bin/python benchmarks/packing.py [--quick] [--out benchmarks/results]
"""

from __future__ import annotations

import argparse
import json
import math
import random
import sys
from dataclasses import dataclass
from pathlib import Path

from areal_hpc.trainer.packing import (
    allocate_micro_batches,
    imbalance,
    micro_batch_lower_bound,
    split_balanced,
)

GOALS = {"microbatches_over_lower_bound": 1.05, "padding_fraction": 0.0, "dp_imbalance": 1.02}


@dataclass(frozen=True)
class Mix:
    """A training step's shape: the paper's settings or the CPU profile's."""

    name: str
    prompts: int
    group: int
    max_prompt: int
    max_new: int
    # Median output length as a fraction of max_new, and the share truncated at max_new.
    median_frac: float
    truncated: float
    budget: int
    dp: int
    minibatches: int = 4

    def lengths(self, rng: random.Random) -> list[int]:
        out = []
        sigma = 0.8
        mu = math.log(self.median_frac * self.max_new)
        for _ in range(self.prompts):
            prompt = rng.randint(self.max_prompt // 8, self.max_prompt)
            for _ in range(self.group):
                new = self.max_new if rng.random() < self.truncated else min(
                    self.max_new, max(1, int(rng.lognormvariate(mu, sigma))))
                out.append(prompt + new - 1)  # tokens the model reads
        return out


MIXES = [
    # Table 3 (1.5B math): 512 x 16, 27,648 new tokens, 32k budget, dp=32 (configs/experiments/math-1.5b.yaml).
    Mix("math-1.5b 32k", 512, 16, 1024, 27_648, 0.30, 0.08, 32_768, 32),
    # Table 2's shorter runs: generation capped at 8192, 16k budget, dp=8.
    Mix("8k context", 512, 16, 1024, 8_192, 0.35, 0.10, 16_384, 8),
    # The CPU profile (configs/experiments/tiny-cpu.yaml): 8 x 4, 256 new tokens, 4096 budget.
    Mix("tiny-cpu", 8, 4, 128, 256, 0.4, 0.05, 4_096, 1, minibatches=2),
]


def padded_fixed(lengths: list[int], per_batch: int) -> tuple[int, int]:
    """Fixed-size micro-batches in arrival order: (micro-batches, tokens computed with padding)."""
    batches = [lengths[i:i + per_batch] for i in range(0, len(lengths), per_batch)]
    return len(batches), sum(len(b) * max(b) for b in batches)


def measure(mix: Mix, seed: int) -> dict:
    lengths = mix.lengths(random.Random(seed))
    per_batch = max(1, mix.budget // (mix.max_prompt + mix.max_new - 1))
    used = bound = fixed = fixed_tokens = 0
    worst_dp = 1.0
    for mb in split_balanced(lengths, mix.minibatches):
        shares = split_balanced([lengths[i] for i in mb], mix.dp)
        worst_dp = max(worst_dp, imbalance([lengths[i] for i in mb], shares))
        for share in shares:
            share_lengths = [lengths[mb[j]] for j in share]
            used += len(allocate_micro_batches(share_lengths, mix.budget))
            bound += micro_batch_lower_bound(share_lengths, mix.budget)
            n, computed = padded_fixed(share_lengths, per_batch)
            fixed += n
            fixed_tokens += computed
    real = sum(lengths)
    return {
        "sequences": len(lengths), "tokens": real, "mean_length": real / len(lengths), "max_length": max(lengths),
        "microbatches": used, "lower_bound": bound, "microbatches_over_lower_bound": used / bound,
        "padding_fraction": 0.0, "dp_imbalance": worst_dp,
        "budget_fill": real / (used * mix.budget), "fixed_budget_fill": real / (fixed * mix.budget),
        "fixed_per_microbatch": per_batch, "fixed_microbatches": fixed,
        "fixed_over_lower_bound": fixed / bound, "fixed_padding_fraction": 1 - real / fixed_tokens,
    }


def run(quick: bool) -> dict:
    seeds = [1] if quick else [1, 2, 3]
    mixes = MIXES if not quick else [Mix(**{**m.__dict__, "prompts": max(m.prompts // 4, 8)}) for m in MIXES]
    results = {}
    for mix in mixes:
        runs = [measure(mix, s) for s in seeds]
        worst = max(runs, key=lambda r: r["microbatches_over_lower_bound"])
        results[mix.name] = {**worst, "dp_imbalance": max(r["dp_imbalance"] for r in runs),
                             "budget": mix.budget, "dp": mix.dp, "minibatches": mix.minibatches,
                             "seeds": seeds}
    summary = {key: max(r[key] for r in results.values()) for key in GOALS}
    return {**summary, "goals": GOALS, "quick": quick, "mixes": results}


def table(report: dict) -> str:
    lines = ["| mix | seqs | mean len | budget x dp | Alg.1 mb / bound | Alg.1 padding | Alg.1 fill |"
             " DP imbalance | fixed mb / bound | fixed padding | fixed fill |",
             "|---|---|---|---|---|---|---|---|---|---|---|"]
    for name, r in report["mixes"].items():
        lines.append(
            f"| {name} | {r['sequences']} | {r['mean_length']:.0f} | {r['budget']} x {r['dp']} |"
            f" {r['microbatches']}/{r['lower_bound']} = {r['microbatches_over_lower_bound']:.3f} |"
            f" {r['padding_fraction']:.3f} | {r['budget_fill']:.3f} | {r['dp_imbalance']:.4f} |"
            f" {r['fixed_microbatches']}/{r['lower_bound']} = {r['fixed_over_lower_bound']:.2f} |"
            f" {r['fixed_padding_fraction']:.3f} | {r['fixed_budget_fill']:.3f} |"
        )
    return "\n".join(lines)


def plot(report: dict, path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    names = list(report["mixes"])
    rows = report["mixes"].values()
    fig, (ax1, ax2) = plt.subplots(1, 2, figsize=(10, 4))
    x = range(len(names))
    ax1.bar([i - 0.2 for i in x], [r["microbatches_over_lower_bound"] for r in rows], 0.4, label="Algorithm 1")
    ax1.bar([i + 0.2 for i in x], [r["fixed_over_lower_bound"] for r in rows], 0.4, label="fixed, padded")
    ax1.axhline(GOALS["microbatches_over_lower_bound"], color="k", ls="--", lw=1, label="goal 1.05")
    ax1.set_xticks(list(x), names)
    ax1.set_ylabel("micro-batches / lower bound")
    ax1.legend()
    ax2.bar([i - 0.2 for i in x], [r["budget_fill"] for r in rows], 0.4, label="Algorithm 1")
    ax2.bar([i + 0.2 for i in x], [r["fixed_budget_fill"] for r in rows], 0.4, label="fixed, padded")
    ax2.set_xticks(list(x), names)
    ax2.set_ylim(0, 1)
    ax2.set_ylabel("real tokens / (micro-batches x budget)")
    ax2.legend()
    fig.suptitle("Micro-batch allocation per training step" + (" (--quick)" if report["quick"] else ""))
    fig.tight_layout()
    fig.savefig(path, dpi=120)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="one seed, a quarter of the prompts")
    parser.add_argument("--out", type=Path, default=Path(__file__).parent / "results")
    args = parser.parse_args(argv)
    report = run(args.quick)
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "packing.json").write_text(json.dumps(report, indent=2) + "\n")
    plot(report, args.out / "packing.png")
    print(table(report))
    met = {k: report[k] <= GOALS[k] for k in GOALS}
    print("\n" + "  ".join(f"{k} = {report[k]:.4f} (goal <= {GOALS[k]}) {'ok' if ok else 'MISSED'}"
                           for k, ok in met.items()))
    print(f"wrote {args.out / 'packing.json'} and {args.out / 'packing.png'}")
    return 0 if all(met.values()) else 1


if __name__ == "__main__":
    sys.exit(main())

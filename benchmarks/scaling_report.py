"""Figure 4 (strong scaling): effective training throughput against GPUs, from a scaling sweep.

Input contract. slurm/scaling_sweep.sh makes one directory per point, holding
  point.json     {"model": "1.5b", "context": "32k", "gpus": 128, "steps": 20, "job_id": "..."}
                 (written by the sweep), and
  metrics.jsonl  written by the run (areal_hpc.metrics.writer): one JSON object per line; the
                 per-step records carry "effective_tokens_per_s", trained tokens per second of
                 wall time. Records without that field are ignored.
A point's throughput is the mean over its step records after the first (the first step includes
starting the engines and filling the pipeline, as in the run's own summary). Points without
metrics yet are listed as missing.

Output: a table on the terminal (k tokens/s per GPU count, and the scaling efficiency against the
smallest point of each series), scaling.json and scaling.png in --out (benchmarks/results), with
the paper's 1.5B figures beside the measured 1.5B series.

Usage: .venv/bin/python benchmarks/scaling_report.py SWEEP_DIR [SWEEP_DIR ...] [--out DIR]
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from statistics import mean

from areal_hpc.metrics.jsonl import read_records
from areal_hpc.metrics.writer import METRICS_FILE

# The paper's Figure 4, AReaL, 1.5B model: effective tokens/s by context and GPUs.
PAPER_1P5B = {
    "16k": {32: 29e3, 64: 55e3, 128: 102e3, 256: 150e3},
    "32k": {32: 30e3, 64: 57e3, 128: 100e3, 256: 150e3},
}
FIELD = "effective_tokens_per_s"


def point_throughput(records: list[dict]) -> tuple[float | None, int]:
    """Mean effective tokens/s over the step records after the first, and how many were averaged."""
    values = [r[FIELD] for r in records if FIELD in r]
    if len(values) > 1:
        values = values[1:]
    return (mean(values) if values else None), len(values)


def collect(sweep_dirs: list[Path]) -> list[dict]:
    """One row per point found under the sweep directories, sorted by series and GPUs."""
    rows = []
    for sweep in sweep_dirs:
        for point_file in sorted(sweep.glob("*/point.json")):
            point = json.loads(point_file.read_text())
            value, n = point_throughput(read_records(point_file.parent / METRICS_FILE))
            rows.append({**point, "run_dir": str(point_file.parent), FIELD: value, "steps_measured": n})
    rows.sort(key=lambda r: (r["model"], r["context"], r["gpus"]))
    for group in _series(rows).values():
        measured = [r for r in group if r[FIELD] is not None]
        for r in group:
            base = measured[0] if measured else None
            r["efficiency"] = ((r[FIELD] / base[FIELD]) / (r["gpus"] / base["gpus"])
                               if base is not None and r[FIELD] is not None else None)
            r["paper"] = PAPER_1P5B.get(r["context"], {}).get(r["gpus"]) if r["model"] == "1.5b" else None
    return rows


def table(rows: list[dict]) -> str:
    gpus = sorted({r["gpus"] for r in rows})
    lines = ["| model | context | | " + " | ".join(f"{g} GPUs" for g in gpus) + " |",
             "|---|---|---|" + "---|" * len(gpus)]
    for (model, context), group in _series(rows).items():
        by_gpus = {r["gpus"]: r for r in group}
        kinds = [("k tokens/s", lambda r: "missing" if r[FIELD] is None else f"{r[FIELD] / 1e3:.1f}"),
                 ("efficiency", lambda r: "" if r["efficiency"] is None else f"{r['efficiency']:.2f}")]
        if any(r["paper"] for r in group):
            kinds.append(("paper k tokens/s", lambda r: f"{r['paper'] / 1e3:.0f}" if r["paper"] else ""))
        for label, fmt in kinds:
            cells = [fmt(by_gpus[g]) if g in by_gpus else "" for g in gpus]
            lines.append(f"| {model} | {context} | {label} | " + " | ".join(cells) + " |")
    return "\n".join(lines)


def _series(rows: list[dict]) -> dict[tuple[str, str], list[dict]]:
    out: dict[tuple[str, str], list[dict]] = {}
    for r in rows:
        out.setdefault((r["model"], r["context"]), []).append(r)
    return out


def plot(rows: list[dict], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(6.4, 4.4))
    for (model, context), group in _series(rows).items():
        done = [r for r in group if r[FIELD] is not None]
        if done:
            line, = ax.plot([r["gpus"] for r in done], [r[FIELD] / 1e3 for r in done], "o-",
                            label=f"{model} {context}")
            base = done[0]
            ax.plot([r["gpus"] for r in done], [base[FIELD] / 1e3 * r["gpus"] / base["gpus"] for r in done],
                    ":", color=line.get_color(), alpha=0.6)
        paper = [r for r in group if r["paper"]]
        if paper:
            ax.plot([r["gpus"] for r in paper], [r["paper"] / 1e3 for r in paper], "x--",
                    label=f"{model} {context} (paper)")
    ax.set_xscale("log", base=2)
    ticks = sorted({r["gpus"] for r in rows})
    ax.set_xticks(ticks, [str(g) for g in ticks])
    ax.minorticks_off()
    ax.set_xlabel("GPUs")
    ax.set_ylabel("effective throughput (k tokens/s)")
    ax.set_title("Strong scaling (dotted: linear from the smallest point)")
    ax.grid(True, alpha=0.3)
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("sweeps", nargs="+", type=Path, help="directories made by slurm/scaling_sweep.sh")
    parser.add_argument("--out", type=Path, default=Path("benchmarks/results"))
    args = parser.parse_args(argv)
    rows = collect(args.sweeps)
    if not rows:
        print(f"no point.json under {', '.join(map(str, args.sweeps))}", file=sys.stderr)
        return 2
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "scaling.json").write_text(json.dumps(rows, indent=1) + "\n")
    plot(rows, args.out / "scaling.png")
    print(table(rows))
    print(f"wrote {args.out / 'scaling.json'} and {args.out / 'scaling.png'}")
    return 0


if __name__ == "__main__":
    sys.exit(main())

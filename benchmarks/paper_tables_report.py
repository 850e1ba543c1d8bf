"""The paper's Tables 1 and 2 from a full-scale sweep (slurm/paper_tables_sweep.sh), beside its numbers.

Input contract. The sweep makes one directory per run, holding
  run.json        {"table": "table2", "model": "1.5b", "run": "eta4", "eta": 4, "decoupled": false,
                   "steps": 250, "job_id": "...", "eval_job_id": "..."} (written by the sweep; a
                   Table 1 base-model evaluation has run "base" and no training job),
  metrics.jsonl   written by the training run: step records carry "step" and "step_s" (wall seconds
                  of that step); a requeued run repeats the steps after its checkpoint, and the
                  last record of each step counts,
  eval/summary.json  written by `areal-hpc eval`: {"datasets": {NAME: {"avg@n": ..., ...}}, ...}.
A run's accuracy is avg@n in percent on the data set named by --dataset (default: the first one of
its summary); its hours are the sum of its steps' wall time. Runs without results yet are missing.

Output: the tables on the terminal, paper_tables.json and paper_tables.png in --out
(benchmarks/results).

Usage: .venv/bin/python benchmarks/paper_tables_report.py SWEEP_DIR [SWEEP_DIR ...] [--out DIR]
       [--dataset NAME]
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from areal_hpc.metrics.jsonl import read_records
from areal_hpc.metrics.writer import METRICS_FILE
from areal_hpc.sim.paper_numbers import TABLE1_1P5B_HOURS, TABLE1_ACCURACY, TABLE2_1P5B

SUMMARY = Path("eval") / "summary.json"
TABLE2_ETAS: list[int | None] = [0, 1, 2, 4, 8, 16, None]


def accuracy(summary_file: Path, dataset: str | None) -> float | None:
    """avg@n in percent of one data set of an evaluation summary; None while there is none."""
    if not summary_file.is_file():
        return None
    datasets = json.loads(summary_file.read_text())["datasets"]
    name = dataset or next(iter(datasets))
    if name not in datasets:
        raise SystemExit(f"{summary_file}: no data set {name!r} (has {', '.join(datasets)})")
    return 100.0 * datasets[name]["avg@n"]


def training_hours(records: list[dict]) -> float | None:
    """Wall hours of the training steps, the last record of each step counting (requeues repeat steps)."""
    per_step = {r["step"]: r["step_s"] for r in records if "step_s" in r}
    return sum(per_step.values()) / 3600 if per_step else None


def collect(sweep_dirs: list[Path], dataset: str | None) -> list[dict]:
    rows = []
    for sweep in sweep_dirs:
        for run_file in sorted(sweep.glob("*/run.json")):
            run = json.loads(run_file.read_text())
            d = run_file.parent
            rows.append({**run, "run_dir": str(d), "accuracy": accuracy(d / SUMMARY, dataset),
                         "hours": training_hours(read_records(d / METRICS_FILE))})
    return rows


def eta_of(row: dict) -> int | None:
    """The run's bound; unbounded (eta at least the run's steps) is None, as in the paper's table."""
    return None if row["eta"] >= row["steps"] else row["eta"]


def table1(rows: list[dict]) -> list[dict]:
    out = []
    for model in sorted({r["model"] for r in rows if r["table"] == "table1"}):
        by_run = {r["run"]: r for r in rows if r["table"] == "table1" and r["model"] == model}
        acc = {run: by_run.get(run, {}).get("accuracy") for run in ("base", "sync", "async")}
        sync_h, async_h = (by_run.get(run, {}).get("hours") for run in ("sync", "async"))
        paper = TABLE1_ACCURACY.get(model, {})
        out.append({
            "model": model,
            **acc,
            **{f"paper_{k}": v for k, v in paper.items()},
            "sync_hours": sync_h, "async_hours": async_h,
            "speedup": sync_h / async_h if sync_h and async_h else None,
            "paper_speedup": TABLE1_1P5B_HOURS["sync AReaL"] / TABLE1_1P5B_HOURS["AReaL"] if model == "1.5b" else None,
        })
    return out


def table2(rows: list[dict]) -> list[dict]:
    runs = [r for r in rows if r["table"] == "table2"]
    out = []
    for eta in TABLE2_ETAS:
        cells = {("decoupled" if r["decoupled"] else "standard"): r["accuracy"] for r in runs if eta_of(r) == eta}
        if eta == 0 and cells:  # one run: the objectives coincide without staleness
            cells = dict.fromkeys(("standard", "decoupled"), next(iter(cells.values())))
        out.append({"eta": eta, "standard": cells.get("standard"), "decoupled": cells.get("decoupled"),
                    "paper_standard": TABLE2_1P5B[eta]["standard"], "paper_decoupled": TABLE2_1P5B[eta]["decoupled"]})
    return out


def _cell(value: float | None, fmt: str = "{:.1f}") -> str:
    return "missing" if value is None else fmt.format(value)


def print_tables(t1: list[dict], t2: list[dict]) -> None:
    if t1:
        print("Table 1: accuracy (avg@n, %) and training hours, measured | paper")
        print("| model | base | sync | async | paper base | paper sync | paper async | sync h | async h | speedup | paper speedup |")
        print("|---|---|---|---|---|---|---|---|---|---|---|")
        for r in t1:
            print(f"| {r['model']} | {_cell(r['base'])} | {_cell(r['sync'])} | {_cell(r['async'])} | "
                  f"{r.get('paper_base', '')} | {r.get('paper_sync', '')} | {r.get('paper_async', '')} | "
                  f"{_cell(r['sync_hours'])} | {_cell(r['async_hours'])} | {_cell(r['speedup'], '{:.2f}x')} | "
                  f"{_cell(r['paper_speedup'], '{:.2f}x') if r['paper_speedup'] else ''} |")
    if any(r["standard"] is not None or r["decoupled"] is not None for r in t2):
        print("Table 2: 1.5B accuracy (avg@n, %) by staleness bound, standard PPO | decoupled, measured | paper")
        print("| eta | standard | decoupled | paper standard | paper decoupled |")
        print("|---|---|---|---|---|")
        for r in t2:
            eta = "inf" if r["eta"] is None else r["eta"]
            print(f"| {eta} | {_cell(r['standard'])} | {_cell(r['decoupled'])} | "
                  f"{r['paper_standard']} | {r['paper_decoupled']} |")


def plot(t1: list[dict], t2: list[dict], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (a1, a2) = plt.subplots(1, 2, figsize=(12, 4.5))
    x = range(len(t2))
    for key, style in (("standard", "o-"), ("decoupled", "s-")):
        a2.plot(x, [r[key] for r in t2], style, label=f"{key} (measured)")
        a2.plot(x, [r[f"paper_{key}"] for r in t2], style, alpha=0.35, label=f"{key} (paper)")
    a2.set_xticks(list(x), ["inf" if r["eta"] is None else str(r["eta"]) for r in t2])
    a2.set(xlabel="staleness bound eta", ylabel="accuracy (%)", title="Table 2 (1.5B)")
    a2.legend()
    width = 0.12
    for i, (key, label) in enumerate([("base", "base"), ("sync", "sync"), ("async", "async")]):
        a1.bar([j + (i - 1) * 2 * width for j in range(len(t1))], [r[key] or 0 for r in t1], width, label=label)
        a1.bar([j + (i - 1) * 2 * width + width for j in range(len(t1))], [r.get(f"paper_{key}", 0) for r in t1],
               width, alpha=0.35, label=f"{label} (paper)")
    a1.set_xticks(list(range(len(t1))), [r["model"] for r in t1])
    a1.set(ylabel="accuracy (%)", title="Table 1")
    if t1:
        a1.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("sweep_dirs", nargs="+", type=Path)
    parser.add_argument("--out", type=Path, default=Path(__file__).resolve().parent / "results")
    parser.add_argument("--dataset", help="evaluation data set (its file's stem); default: the first")
    args = parser.parse_args(argv)
    rows = collect(args.sweep_dirs, args.dataset)
    if not rows:
        print(f"no run.json under {', '.join(map(str, args.sweep_dirs))}", file=sys.stderr)
        return 2
    t1, t2 = table1(rows), table2(rows)
    print_tables(t1, t2)
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "paper_tables.json").write_text(json.dumps({"runs": rows, "table1": t1, "table2": t2}, indent=1))
    plot(t1, t2, args.out / "paper_tables.png")
    print(f"wrote {args.out / 'paper_tables.json'} and {args.out / 'paper_tables.png'}")
    return 0


if __name__ == "__main__":
    sys.exit(main())

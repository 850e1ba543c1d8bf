"""The launch check (`areal-hpc slurm verify`) of every paper layout and of its 512-GPU point.

For each shipped paper experiment, and for the same experiment at the 512-GPU strong-scaling point
(`areal-hpc slurm scale CONFIG 512`), the layout is verified at its true shapes on the meta device,
from config.json alone, exactly as the command does. Recorded per layout: trainer peak memory per
GPU (fullest stage), generator memory per GPU (reserved, weights) and KV-cache sequences at the
longest context, the weight update's buckets and bytes per stage and the size of its NCCL groups,
and the wall seconds of the command (a fresh process each, imports included). The check builds
only distinct trainer shards, so its time must not grow with the rank count: `seconds_ratio_512`
is the 512-GPU point's time over the paper layout's (goal <= 2).

Usage: .venv/bin/python benchmarks/launch_check.py [--quick] [--hardware h800] [--out benchmarks/results]
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import time
from pathlib import Path

from areal_hpc.config.load import load_config
from areal_hpc.slurm.scaling import parse_context, strong_scaling_overrides

PAPER = ("math-1.5b", "math-7b", "code-14b", "code-32b")
POINT_GPUS = 512
GOAL_SECONDS_RATIO = 2.0
GB = 1e9


def layouts(quick: bool) -> list[tuple[str, str, list[str]]]:
    """(label, config path, overrides) of every layout checked: each paper layout, then its 512-GPU point."""
    out = []
    for name in PAPER[:1] if quick else PAPER:
        path = f"configs/experiments/{name}.yaml"
        point = strong_scaling_overrides(load_config(path, check_files=False), POINT_GPUS, parse_context("32k"),
                                         20, f"runs/{name}-{POINT_GPUS}")
        out += [(name, path, []), (f"{name}@{POINT_GPUS}", path, point)]
    return out


def summarize(label: str, d: dict) -> dict:
    """The figures of one verified layout, from `slurm verify --json`'s data."""
    t, g = d["trainer"], d["generator"]
    return {
        "layout": label,
        "ok": d["ok"],
        "problems": d["problems"],
        "trainers": t["world"],
        "tp_pp_dp": [t["tp"], t["pp"], t["dp"]],
        "shards_built": len(t["built_ranks"]),
        "trainer_peak_gb": max(s["peak_bytes"] for s in t["stages"]) / GB,
        "trainer_limit_gb": t["limit_bytes"] / GB,
        "engines": g["engines"],
        "generator_tp": g["tp"],
        "generator_reserved_gb": g["reserved_bytes"] / GB,
        "generator_weights_gb": g["weight_bytes_per_gpu"] / GB,
        "kv_sequences_at_longest": g["sequences_at_longest"],
        "longest_sequence": g["longest_sequence"],
        "buckets_per_stage": [u["buckets"] for u in d["weight_update"]],
        "gb_per_stage": [u["bytes"] / GB for u in d["weight_update"]],
        "group_world": d["weight_update"][0]["group_world"] if d["weight_update"] else 0,
        "gpu": d["gpu"],
        "check_seconds": d["seconds"],
    }


def verify_command(path: str, overrides: list[str], gpu: str) -> tuple[dict, float]:
    """`areal-hpc slurm verify --json` in a fresh process, as a user runs it: its data and wall seconds
    (imports included, so every layout pays the same start)."""
    cli = Path(sys.executable).with_name("areal-hpc")
    cmd = [str(cli), "slurm", "verify", path, "--hardware", gpu, "--json", *(a for o in overrides for a in ("--set", o))]
    start = time.perf_counter()
    done = subprocess.run(cmd, capture_output=True, text=True)
    seconds = time.perf_counter() - start
    if done.returncode not in (0, 2) or not done.stdout.strip():
        raise RuntimeError(f"{' '.join(cmd)} exited {done.returncode}: {done.stderr.strip()[-2000:]}")
    return json.loads(done.stdout), seconds


def run(quick: bool, gpu: str) -> dict:
    rows = []
    for label, path, overrides in layouts(quick):
        data, wall = verify_command(path, overrides, gpu)
        rows.append(summarize(label, data) | {"command_seconds": wall})
        print(f"verified {label}: {'ok' if rows[-1]['ok'] else 'PROBLEMS'} in {wall:.1f} s", flush=True)
    by = {r["layout"]: r for r in rows}
    ratios = {name: by[f"{name}@{POINT_GPUS}"]["command_seconds"] / by[name]["command_seconds"]
              for name in PAPER if name in by}
    return {"gpu": rows[0]["gpu"], "layouts": rows, "all_ok": all(r["ok"] for r in rows),
            "seconds_ratio_512": max(ratios.values()), "seconds_ratio_512_by_layout": ratios}


def table(report: dict) -> str:
    head = (f"{'layout':<16} {'trainers':>8} {'tp.pp.dp':>9} {'built':>5} {'train GB':>9} {'engines':>7}"
            f" {'gen GB (w)':>11} {'seqs':>5} {'buckets/stage':>14} {'GB/stage':>9} {'group':>5} {'s':>6}")
    lines = [head, "-" * len(head)]
    for r in report["layouts"]:
        lines.append(
            f"{r['layout']:<16} {r['trainers']:>8} {'.'.join(map(str, r['tp_pp_dp'])):>9} {r['shards_built']:>5}"
            f" {r['trainer_peak_gb']:>9.1f} {r['engines']:>7}"
            f" {r['generator_reserved_gb']:>5.1f} ({r['generator_weights_gb']:.1f})"
            f" {r['kv_sequences_at_longest']:>5} {'+'.join(map(str, r['buckets_per_stage'])):>14}"
            f" {r['gb_per_stage'][0]:>9.2f} {r['group_world']:>5} {r['command_seconds']:>6.1f}")
    return "\n".join(lines)


def plot(report: dict, path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    rows = report["layouts"]
    labels = [r["layout"] for r in rows]
    x = range(len(rows))
    fig, (mem, secs) = plt.subplots(1, 2, figsize=(12, 4.2))
    mem.bar([i - 0.2 for i in x], [r["trainer_peak_gb"] for r in rows], 0.4, label="trainer peak (fullest stage)")
    mem.bar([i + 0.2 for i in x], [r["generator_reserved_gb"] for r in rows], 0.4, label="generator reserved")
    mem.axhline(rows[0]["trainer_limit_gb"], color="k", ls="--", lw=1, label="trainer usable HBM")
    mem.set_xticks(list(x), labels, rotation=30, ha="right")
    mem.set_ylabel(f"GB per GPU ({report['gpu']})")
    mem.set_title("memory per GPU at true shapes")
    mem.legend(fontsize=8, loc="lower right")
    secs.bar(list(x), [r["command_seconds"] for r in rows], color="tab:green")
    secs.set_xticks(list(x), labels, rotation=30, ha="right")
    secs.set_ylabel("seconds")
    secs.set_title("`slurm verify` wall time, imports included")
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="math-1.5b and its 512-GPU point only")
    parser.add_argument("--hardware", default="h800", help="GPU preset of the memory check: h800 (the paper's), h100 or h200")
    parser.add_argument("--out", type=Path, default=Path(__file__).parent / "results")
    args = parser.parse_args(argv)
    report = run(args.quick, args.hardware)
    args.out.mkdir(parents=True, exist_ok=True)
    name = "launch_check_quick" if args.quick else "launch_check"
    (args.out / f"{name}.json").write_text(json.dumps(report, indent=2) + "\n")
    plot(report, args.out / f"{name}.png")
    print(table(report))
    ok = report["all_ok"] and report["seconds_ratio_512"] <= GOAL_SECONDS_RATIO
    print(f"\nevery layout verified: {report['all_ok']}; 512-GPU time over the paper layout's:"
          f" {report['seconds_ratio_512']:.2f} (goal <= {GOAL_SECONDS_RATIO}) {'ok' if ok else 'MISSED'}")
    print(f"wrote {args.out / (name + '.json')} and {args.out / (name + '.png')}")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())

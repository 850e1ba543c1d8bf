"""The cluster simulator against the AReaL paper: Figure 4 (strong scaling), Figure 5c and
Table 7 (throughput by staleness bound) and Table 1 (training hours), side by side.

    .venv/bin/python benchmarks/sim_paper.py [--quick]

Prints the error table, writes benchmarks/results/sim_paper.json and two PNG plots. Only the
Figure 4 16k row was used to fit the simulator's efficiencies (role "fit"); every other number is
a prediction. Simulations run in two processes.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import sys
import time
from concurrent.futures import ProcessPoolExecutor
from dataclasses import asdict, replace
from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402

from areal_hpc.sim import paper_numbers as paper  # noqa: E402
from areal_hpc.sim import predict  # noqa: E402
from areal_hpc.sim.calibration import FITTED  # noqa: E402
from areal_hpc.sim.layout import split_layout  # noqa: E402

RESULTS = Path(__file__).resolve().parent / "results"
FIG4_GPUS = (32, 64, 128, 256)
# Figure 5c's GPU count is not in the notes: assume the 1.5B run of Table 1 (16 nodes).
FIG5C_GPUS = 128
ETAS_5C: tuple[int | None, ...] = (0, 1, 2, 4, 8, 16, None)


def _scaling(model: str, context: int, gpus: int, system: str, fid: predict.Fidelity) -> float | None:
    return predict.scaling(model, context, [gpus], system, fidelity=fid)[0].tokens_per_s


def _staleness(model: str, gpus: int, eta: int | None, context: int, batch_prompts: int | None,
               fid: predict.Fidelity) -> float | None:
    cfg = predict.experiment(model)
    layout = split_layout(cfg, gpus)
    w = predict.workload_for(cfg, layout, context).with_eta(eta)
    if batch_prompts is not None:
        # Table 7's batch, and a micro-batch token budget of one 8k sequence (the Table 3 budget of
        # 32k tokens does not fit two 1.5B trainer GPUs)
        w = replace(w, batch_prompts=batch_prompts, micro_batch_tokens=context)
    return predict.simulate(cfg, layout, w, fidelity=fid).tokens_per_s


def _hours(model: str, system: str, fid: predict.Fidelity) -> float | None:
    """Table 1's hours as the paper ran them: the 1.5B (and, assumed, the 7B) at Table 2's 8k
    generation cap and eta 4; "sync AReaL" is the asynchronous system's GPUs with eta = 0."""
    nodes, steps = paper.TABLE1_NODES[model], paper.TABLE1_STEPS[model]
    context = eta = None
    if model in ("1.5b", "7b"):
        context = predict.experiment(model).rollout.max_prompt_len + paper.TABLE1_1P5B_MAX_NEW_TOKENS
        eta = paper.TABLE1_1P5B_ETA
    if system == "sync AReaL":
        system, eta = "AReaL", 0
    pred = predict.hours(model, nodes, "areal" if system == "AReaL" else "sync", fidelity=fid, context=context,
                         eta=eta if system == "AReaL" else None)
    return None if pred.run is None else pred.run.hours(steps)


def _call(job: tuple) -> float | None:
    fn, args = job
    return {"scaling": _scaling, "staleness": _staleness, "hours": _hours}[fn](*args)


def jobs(fid: predict.Fidelity) -> list[tuple[dict, tuple]]:
    """(row description, simulation job) for every comparison."""
    out = []
    for context, systems in paper.FIG4_1P5B.items():
        role = "fit" if context == paper.CALIBRATION_CONTEXT else "prediction"
        for system, points in systems.items():
            for gpus in FIG4_GPUS:
                row = {"source": f"Fig 4, 1.5B {context // 1024}k", "setting": f"{system} {gpus} GPUs",
                       "paper": points[gpus], "unit": "tokens/s", "role": role}
                out.append((row, ("scaling", ("1.5b", context, gpus, system, fid))))
    context_5c = predict.experiment("1.5b").rollout.max_prompt_len + paper.FIG5C_MAX_NEW_TOKENS
    for eta in ETAS_5C:
        row = {"source": "Fig 5c, 1.5B", "setting": f"eta {'inf' if eta is None else eta}, {FIG5C_GPUS} GPUs",
               "paper": paper.FIG5C_1P5B[eta], "unit": "tokens/s", "role": "prediction"}
        out.append((row, ("staleness", ("1.5b", FIG5C_GPUS, eta, context_5c, None, fid))))
    for eta, value in paper.TABLE7_1P5B.items():
        row = {"source": "Table 7, 1.5B", "setting": f"eta {eta}, {paper.TABLE7_GPUS} GPUs, 64x16",
               "paper": value, "unit": "tokens/s", "role": "prediction"}
        out.append((row, ("staleness", ("1.5b", paper.TABLE7_GPUS, eta, paper.TABLE7_CONTEXT,
                                         paper.TABLE7_BATCH_PROMPTS, fid))))
    for system, hours in paper.TABLE1_1P5B_HOURS.items():
        row = {"source": "Table 1, 1.5B hours", "setting": f"{system}, 16 nodes, 250 steps",
               "paper": hours, "unit": "hours", "role": "prediction"}
        out.append((row, ("hours", ("1.5b", "sync" if system == "verl" else system, fid))))
    for system, hours in paper.TABLE1_7B_HOURS.items():
        row = {"source": "Table 1, 7B hours", "setting": f"{system}, {paper.TABLE1_NODES['7b']} nodes, {paper.TABLE1_STEPS['7b']} steps",
               "paper": hours, "unit": "hours", "role": "prediction"}
        out.append((row, ("hours", ("7b", system, fid))))
    for model in ("14b", "32b"):
        for system in ("AReaL", "sync"):
            row = {"source": f"Table 1, {model.upper()} hours",
                   "setting": f"{system}, {paper.TABLE1_NODES[model]} nodes, {paper.TABLE1_STEPS[model]} steps",
                   "paper": None, "unit": "hours", "role": "prediction"}
            out.append((row, ("hours", (model, system, fid))))
    for model, gpus in (("7b", 64), ("7b", 512), ("32b", 256), ("32b", 512)):
        for system in ("areal", "sync"):
            row = {"source": f"Fig 4, {model.upper()} 32k", "setting": f"{system} {gpus} GPUs",
                   "paper": None, "unit": "tokens/s", "role": "check"}
            out.append((row, ("scaling", (model, 32768, gpus, system, fid))))
    return out


# Speed-ups the paper reports or implies: (name, numerator row, denominator row). A model can
# miss absolute levels and still get these right, or the reverse.
RATIOS = [
    ("Table 1: AReaL speed-up over verl", ("Table 1, 1.5B hours", "verl, 16 nodes, 250 steps"),
     ("Table 1, 1.5B hours", "AReaL, 16 nodes, 250 steps")),
    ("Table 1: AReaL speed-up over sync AReaL", ("Table 1, 1.5B hours", "sync AReaL, 16 nodes, 250 steps"),
     ("Table 1, 1.5B hours", "AReaL, 16 nodes, 250 steps")),
    ("Table 1: 7B AReaL speed-up over sync AReaL", ("Table 1, 7B hours", "sync AReaL, 24 nodes, 250 steps"),
     ("Table 1, 7B hours", "AReaL, 24 nodes, 250 steps")),
    ("Fig 5c: eta inf over eta 0", ("Fig 5c, 1.5B", f"eta inf, {FIG5C_GPUS} GPUs"),
     ("Fig 5c, 1.5B", f"eta 0, {FIG5C_GPUS} GPUs")),
    ("Table 7: eta 16 over eta 0", ("Table 7, 1.5B", "eta 16, 8 GPUs, 64x16"), ("Table 7, 1.5B", "eta 0, 8 GPUs, 64x16")),
    ("Fig 4 16k: AReaL over sync at 256 GPUs", ("Fig 4, 1.5B 16k", "areal 256 GPUs"), ("Fig 4, 1.5B 16k", "sync 256 GPUs")),
    ("Fig 4 32k: AReaL over sync at 256 GPUs", ("Fig 4, 1.5B 32k", "areal 256 GPUs"), ("Fig 4, 1.5B 32k", "sync 256 GPUs")),
    ("Fig 4 32k: AReaL 256 over 32 GPUs", ("Fig 4, 1.5B 32k", "areal 256 GPUs"), ("Fig 4, 1.5B 32k", "areal 32 GPUs")),
]


def ratios(rows: list[dict]) -> list[dict]:
    by_key = {(r["source"], r["setting"]): r for r in rows}
    out = []
    for name, num, den in RATIOS:
        n, d = by_key[num], by_key[den]
        paper_ratio = n["paper"] / d["paper"]
        sim = None if n["simulated"] is None or d["simulated"] is None else n["simulated"] / d["simulated"]
        out.append({"ratio": name, "paper": paper_ratio, "simulated": sim,
                    "error": None if sim is None else sim / paper_ratio - 1.0})
    return out


def checks(rows: list[dict]) -> list[dict]:
    """The paper's qualitative claims for 7B and 32B (Figure 4), tested on the predictions."""
    value = {(r["source"], r["setting"]): r["simulated"] for r in rows}

    def eff(system: str) -> float:
        small, large = value[("Fig 4, 7B 32k", f"{system} 64 GPUs")], value[("Fig 4, 7B 32k", f"{system} 512 GPUs")]
        return large / small / 8

    sync_32b_oom = all(value[("Fig 4, 32B 32k", f"sync {g} GPUs")] is None for g in (256, 512))
    return [
        {"claim": "7B 32k, 64 -> 512 GPUs: AReaL scales near-linearly", "value": eff("areal"),
         "holds": eff("areal") >= 0.7},
        {"claim": "7B 32k, 64 -> 512 GPUs: the synchronous system scales sub-linearly", "value": eff("sync"),
         "holds": eff("sync") < eff("areal")},
        {"claim": "32B 32k: the synchronous system runs out of memory", "value": sync_32b_oom,
         "holds": sync_32b_oom},
    ]


def fmt(value: float, unit: str) -> str:
    return f"{value:.1f}" if unit == "hours" else f"{value / 1e3:.1f}k"


def print_table(rows: list[dict]) -> None:
    print(f"{'source':22s} {'setting':32s} {'role':10s} {'paper':>8s} {'sim':>8s} {'error':>7s}")
    for r in rows:
        sim = "OOM" if r["simulated"] is None else fmt(r["simulated"], r["unit"])
        paper_v = "-" if r["paper"] is None else fmt(r["paper"], r["unit"])
        err = "" if r["error"] is None else f"{r['error']:+.0%}"
        print(f"{r['source']:22s} {r['setting']:32s} {r['role']:10s} {paper_v:>8s} {sim:>8s} {err:>7s}")


def summary(rows: list[dict]) -> dict[str, dict]:
    """Median and largest absolute relative error per source (and for all predictions)."""
    groups: dict[str, list[float]] = {}
    for r in rows:
        if r["error"] is None:
            continue
        key = r["source"] if r["role"] == "prediction" else f"{r['source']} (fit)"
        groups.setdefault(key, []).append(abs(r["error"]))
        if r["role"] == "prediction":
            groups.setdefault("all predictions", []).append(abs(r["error"]))
    out = {}
    for key, errs in groups.items():
        errs = sorted(errs)
        mid = len(errs) // 2
        median = errs[mid] if len(errs) % 2 else (errs[mid - 1] + errs[mid]) / 2
        out[key] = {"n": len(errs), "median_abs_error": median, "max_abs_error": errs[-1]}
    return out


def plot(rows: list[dict], out_dir: Path) -> list[Path]:
    value = {(r["source"], r["setting"]): r for r in rows}
    fig, axes = plt.subplots(1, 2, figsize=(11, 4.2))
    for ax, context in zip(axes, (16, 32), strict=True):
        for system, color in (("areal", "tab:blue"), ("sync", "tab:red")):
            pts = [value[(f"Fig 4, 1.5B {context}k", f"{system} {g} GPUs")] for g in FIG4_GPUS]
            ax.plot(FIG4_GPUS, [p["paper"] / 1e3 for p in pts], "o-", color=color, label=f"{system} (paper)")
            ax.plot(FIG4_GPUS, [(p["simulated"] or math.nan) / 1e3 for p in pts], "s--", color=color,
                    label=f"{system} (simulated)")
        ax.set_xscale("log", base=2)
        ax.set_xticks(FIG4_GPUS, [str(g) for g in FIG4_GPUS])
        ax.set_xlabel("GPUs")
        ax.set_ylabel("effective throughput (k tokens/s)")
        ax.set_title(f"1.5B, {context}k context" + (" (calibration row)" if context == 16 else " (prediction)"))
        ax.grid(alpha=0.3)
        ax.legend(fontsize=8)
    fig.tight_layout()
    scaling_png = out_dir / "sim_paper_scaling.png"
    fig.savefig(scaling_png, dpi=120)
    plt.close(fig)

    fig, axes = plt.subplots(1, 2, figsize=(11, 4.2))
    for ax, source, title in ((axes[0], "Fig 5c, 1.5B", f"Figure 5c: 1.5B, 8k generation, {FIG5C_GPUS} GPUs (assumed)"),
                              (axes[1], "Table 7, 1.5B", "Table 7: 1.5B, 8 GPUs, 8k context, 64x16")):
        pts = [r for r in rows if r["source"] == source]
        labels = [r["setting"].split(",")[0].replace("eta ", "") for r in pts]
        x = range(len(pts))
        ax.plot(x, [r["paper"] / 1e3 for r in pts], "o-", label="paper")
        ax.plot(x, [(r["simulated"] or math.nan) / 1e3 for r in pts], "s--", label="simulated")
        ax.set_xticks(list(x), labels)
        ax.set_xlabel("staleness bound eta")
        ax.set_ylabel("effective throughput (k tokens/s)")
        ax.set_title(title, fontsize=10)
        ax.grid(alpha=0.3)
        ax.legend(fontsize=8)
    fig.tight_layout()
    staleness_png = out_dir / "sim_paper_staleness.png"
    fig.savefig(staleness_png, dpi=120)
    plt.close(fig)
    return [scaling_png, staleness_png]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="fewer simulated steps (noisier, ~2x faster)")
    parser.add_argument("--out", type=Path, default=RESULTS, help="directory for the JSON and PNG files")
    parser.add_argument("--workers", type=int, default=min(2, os.cpu_count() or 1))
    args = parser.parse_args(argv)
    fid = predict.QUICK if args.quick else predict.DEFAULT
    start = time.time()
    specs = jobs(fid)
    with ProcessPoolExecutor(max_workers=args.workers) as pool:
        values = list(pool.map(_call, [job for _, job in specs]))
    rows = []
    for (row, _), sim in zip(specs, values, strict=True):
        error = None if row["paper"] is None or sim is None else sim / row["paper"] - 1.0
        rows.append({**row, "simulated": sim, "error": error})
    elapsed = time.time() - start
    print_table(rows)
    stats = summary(rows)
    print()
    for key, s in stats.items():
        print(f"{key:30s} n={s['n']:2d}  median |error| {s['median_abs_error']:.0%}  max {s['max_abs_error']:.0%}")
    print()
    speedups = ratios(rows)
    for r in speedups:
        print(f"{r['ratio']:42s} paper {r['paper']:5.2f}  sim {r['simulated']:5.2f}  {r['error']:+.0%}")
    print()
    claims = checks(rows)
    for c in claims:
        print(f"{'holds' if c['holds'] else 'FAILS':5s}  {c['claim']} ({c['value']})")
    args.out.mkdir(parents=True, exist_ok=True)
    pngs = plot(rows, args.out)
    result = {"efficiency": asdict(FITTED), "fidelity": asdict(fid), "elapsed_s": elapsed, "rows": rows,
              "summary": stats, "ratios": speedups, "checks": claims}
    (args.out / "sim_paper.json").write_text(json.dumps(result, indent=1) + "\n")
    print(f"\n{len(rows)} comparisons in {elapsed:.0f} s; wrote {args.out / 'sim_paper.json'}, "
          + ", ".join(str(p) for p in pngs))
    return 0


if __name__ == "__main__":
    sys.exit(main())

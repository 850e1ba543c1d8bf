"""What losing a generator costs a run: it goes on with the others, in place.

A generator that dies mid-run (SIGKILL, as the out-of-memory killer kills) is dropped by rank 0,
which hands its prompts in flight to the others and rebuilds the weight groups without it
(docs/fault-tolerance.md); the run completes without a restart. Both jobs run under mpiexec with one
proxy per rank and -disable-auto-cleanup (areal_hpc.launch.mpiexec_surviving_loss), as a cluster's
mpiexec has one proxy per node.

Two jobs of the tiny-cpu miniature with 2 generators (4 MPI ranks), STEPS steps:
- clean: no fault, the reference throughput and step time;
- killed: AREAL_HPC_FAULT=generator:1:update@KILL_AT:kill, generator 1 dies as the weights of
  version KILL_AT reach it, right after that step: the worst moment, mid-transfer, so the update
  breaks on the trainer and on the other generator too and is done again without it.
Figures, from the step records' wall_time and rank 0's log:
- detection: seconds from the kill to rank 0's "going on without it";
- recovery: seconds from the kill to the first step trained after the loss, and that in steps of
  the clean run;
- steps lost: steps trained twice or never (a restart would train again those since the last
  checkpoint);
- effective throughput (trained tokens per second) clean, before the kill and after the recovery;
- the final ledger: every prompt trained exactly once, every step of B prompts.
The issue's goal is 0 steps lost and a recovery under one step.

Writes faults.json and .png under --out and prints the table.
Usage: .venv/bin/python benchmarks/faults.py [--quick] [--steps N] [--work-dir runs/faults] [--out benchmarks/results]
"""

from __future__ import annotations

import argparse
import datetime
import json
import shlex
import shutil
import sys
from pathlib import Path

import rl_runs

from areal_hpc.config.load import load_config
from areal_hpc.launch import mpiexec_surviving_loss
from areal_hpc.metrics.jsonl import read_records
from areal_hpc.metrics.writer import METRICS_FILE

CONFIG = "configs/experiments/tiny-cpu.yaml"
REPORT = "faults"
STEPS = 12
QUICK_STEPS = 9
KILL_AT = 4
GENERATORS = 2
FAULT = "generator:{index}:update@{version}:kill"
LOSS_SEEN = "going on without it"
# One step of the run's own data and reward; no held-out rounds inside the measured steps, no
# checkpoints (nothing is restarted).
SHARED = ("logging.tensorboard=false", "data.synthetic_eval_size=4", "eval.n=1", "eval_interval=0",
          "checkpoint.interval_steps=0")


def overrides(steps: int, model: Path) -> list[str]:
    return [f"model.path={model}", f"total_steps={steps}", f"generator.count={GENERATORS}",
            f"cluster.rollout_nodes={GENERATORS}", *SHARED]


# ---- figures (pure) ---------------------------------------------------------------------------


def steps_of(records: list[dict]) -> list[dict]:
    return [r for r in records if "trained_tokens" in r]


def rate(steps: list[dict]) -> float:
    """Trained tokens per second over these steps (pooled)."""
    seconds = sum(r["step_s"] for r in steps)
    return sum(r["trained_tokens"] for r in steps) / seconds if seconds > 0 else float("nan")


def ledger_problems(ledger: list[dict], steps: int, batch_prompts: int) -> list[str]:
    """Why the final ledger is not every step once with its own B prompts, none twice; [] if it is."""
    found = []
    if [int(e["step"]) for e in ledger] != list(range(steps)):
        found.append(f"steps {[e['step'] for e in ledger]}, not 0..{steps - 1} once each")
    short = [e["step"] for e in ledger if len(e["prompt_ids"]) != batch_prompts]
    if short:
        found.append(f"steps {short} did not train {batch_prompts} prompts")
    ids = [pid for e in ledger for pid in e["prompt_ids"]]
    if len(ids) != len(set(ids)):
        found.append(f"{len(ids) - len(set(ids))} prompts trained twice")
    return found


def log_time(line: str) -> float:
    """Unix time of a rank's log line ("2026-12-02 06:52:03,220 [rank 0 controller] ...", local time)."""
    return datetime.datetime.strptime(line[:23], "%Y-%m-%d %H:%M:%S,%f").timestamp()


def figures(clean: list[dict], killed: list[dict], kill_at: int, loss_seen: float, steps: int) -> dict[str, float]:
    """The recovery figures from the two jobs' step records and the moment rank 0 saw the loss."""
    at_kill = [r for r in killed if int(r["version"]) == kill_at]
    if not at_kill:
        raise ValueError(f"the killed run trained up to version {int(killed[-1]['version']) if killed else 0},"
                         f" never {kill_at}: the fault fired elsewhere")
    kill_time = at_kill[0]["wall_time"]
    after = [r for r in killed if r["generators_alive"] < GENERATORS]
    if not after:
        raise ValueError("no step was trained after the loss (generators_alive never dropped)")
    clean_step_s = sum(r["step_s"] for r in clean[1:]) / max(1, len(clean) - 1)
    recovery_s = after[0]["wall_time"] - kill_time
    versions = [int(r["version"]) for r in killed]
    return {
        "detection_s": loss_seen - kill_time,
        "recovery_s": recovery_s,
        "recovery_steps": recovery_s / clean_step_s,
        "steps_lost": float(len(versions) - len(set(versions)) + steps - len(set(versions))),
        "clean_step_s": clean_step_s,
        "clean_tokens_per_s": rate(clean[1:]),
        "before_tokens_per_s": rate([r for r in killed[1:] if int(r["version"]) <= kill_at]),
        "after_tokens_per_s": rate(after[1:]),
        "generators_after": float(after[-1]["generators_alive"]),
        "clean_wall_s": clean[-1]["wall_time"] - clean[0]["wall_time"] + clean[0]["step_s"],
        "killed_wall_s": killed[-1]["wall_time"] - killed[0]["wall_time"] + killed[0]["step_s"],
    }


def table(report: dict) -> str:
    f = report["figures"]
    rows = [
        ("steps lost (trained twice or never)", f"{f['steps_lost']:.0f}", "0"),
        ("detection: kill -> rank 0 goes on without it", f"{f['detection_s']:.2f} s", "-"),
        ("recovery: kill -> first step after the loss", f"{f['recovery_s']:.1f} s = {f['recovery_steps']:.2f} steps",
         "< 1 step"),
        ("effective tokens/s, clean run (2 generators)", f"{f['clean_tokens_per_s']:.0f}", "-"),
        ("effective tokens/s, before the kill (2 generators)", f"{f['before_tokens_per_s']:.0f}", "-"),
        (f"effective tokens/s, after the recovery ({f['generators_after']:.0f} generator)",
         f"{f['after_tokens_per_s']:.0f}", "-"),
        ("wall seconds of the steps, clean / killed", f"{f['clean_wall_s']:.0f} / {f['killed_wall_s']:.0f}", "-"),
    ]
    lines = ["| figure | measured | goal |", "|---|---|---|"] + [f"| {a} | {b} | {c} |" for a, b, c in rows]
    ledger = report["ledger_problems"]
    lines.append("")
    lines.append("ledger: every prompt trained exactly once" if not ledger else "ledger: " + "; ".join(ledger))
    return "\n".join(lines)


def plot(report: dict, path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(8, 4.2))
    for name, steps, style in (("clean run", report["clean_steps"], "C7.--"),
                               ("generator 1 killed", report["killed_steps"], "C3o-")):
        t0 = steps[0]["wall_time"] - steps[0]["step_s"]
        ax.plot([r["wall_time"] - t0 for r in steps], [r["version"] for r in steps], style, label=name, ms=3)
    killed = report["killed_steps"]
    t0 = killed[0]["wall_time"] - killed[0]["step_s"]
    kill = next(r for r in killed if int(r["version"]) == report["kill_at"])["wall_time"] - t0
    ax.axvline(kill, color="C3", lw=1, ls=":")
    ax.annotate("generator 1 killed", (kill, 0.5), fontsize=8, color="C3")
    ax.set_xlabel("wall seconds from the first step's start")
    ax.set_ylabel("policy version trained")
    f = report["figures"]
    ax.set_title(f"losing one of 2 generators mid-update: {f['steps_lost']:.0f} steps lost, recovery"
                 f" {f['recovery_s']:.1f} s ({f['recovery_steps']:.2f} steps)", fontsize=10)
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)


# ---- running ----------------------------------------------------------------------------------


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--steps", type=int, default=None, help=f"steps per run (default {STEPS}, --quick {QUICK_STEPS})")
    p.add_argument("--quick", action="store_true", help=f"{QUICK_STEPS} steps per run")
    p.add_argument("--work-dir", type=Path, default=Path("runs/faults"))
    p.add_argument("--out", type=Path, default=Path(__file__).parent / "results")
    p.add_argument("--timeout", type=float, default=900.0, help="seconds one job may take")
    args = p.parse_args()
    args.steps = args.steps or (QUICK_STEPS if args.quick else STEPS)
    if args.steps <= KILL_AT + 2:
        p.error(f"--steps {args.steps}: more than {KILL_AT + 2}, so steps follow the recovery")
    cfg = load_config(CONFIG, overrides(args.steps, Path("model")), check_files=False)
    ranks, batch = cfg.world_size, cfg.rollout.batch_prompts
    base = overrides(args.steps, rl_runs.random_model())
    launcher = mpiexec_surviving_loss(ranks)
    command = shlex.join([".venv/bin/python", "benchmarks/faults.py", *sys.argv[1:]])
    shutil.rmtree(args.work_dir, ignore_errors=True)

    clean_dir, killed_dir = args.work_dir / "clean", args.work_dir / "killed"
    print(f"[1/2] clean run: {args.steps} steps, {GENERATORS} generators", flush=True)
    clean = rl_runs.launch(clean_dir, base, args.timeout, CONFIG, ranks, mpiexec_args=launcher)
    if clean.returncode != 0:
        raise SystemExit(f"the clean run failed ({clean.returncode}):\n{clean.stderr[-4000:]}")
    clean_steps = steps_of(read_records(clean_dir / METRICS_FILE))

    fault = FAULT.format(index=GENERATORS - 1, version=KILL_AT)
    print(f"[2/2] killed run: AREAL_HPC_FAULT={fault}", flush=True)
    killed = rl_runs.launch(killed_dir, base, args.timeout, CONFIG, ranks, env={"AREAL_HPC_FAULT": fault},
                            mpiexec_args=launcher)
    output = (killed.stdout + killed.stderr).splitlines()
    seen = [line for line in output if LOSS_SEEN in line]
    if not seen or f"metrics: {killed_dir / METRICS_FILE}" not in killed.stdout + killed.stderr:
        raise SystemExit(f"the killed run did not go on without the generator ({killed.returncode}):\n"
                         + "\n".join(output[-40:]))
    killed_steps = steps_of(read_records(killed_dir / METRICS_FILE))
    ledger = read_records(killed_dir / "ledger.jsonl")

    report = {
        "command": command, "config": CONFIG, "steps": args.steps, "kill_at": KILL_AT, "fault": fault,
        "named": seen[0].split("] ", 1)[-1].split(": ", 1)[-1], "killed_returncode": killed.returncode,
        "figures": figures(clean_steps, killed_steps, KILL_AT, log_time(seen[0]), args.steps),
        "ledger_problems": ledger_problems(ledger, args.steps, batch),
        "jobs_s": {"clean": clean.seconds, "killed": killed.seconds},
        "clean_steps": clean_steps, "killed_steps": killed_steps,
    }
    args.out.mkdir(parents=True, exist_ok=True)
    path = args.out / f"{REPORT}.json"
    path.write_text(json.dumps(report, indent=1))
    plot(report, args.out / f"{REPORT}.png")
    print(f"named: {report['named']} (mpiexec's exit status {killed.returncode}: the killed rank's)")
    print(table(report))
    print(f"wrote {path} and {args.out / f'{REPORT}.png'}")


if __name__ == "__main__":
    main()

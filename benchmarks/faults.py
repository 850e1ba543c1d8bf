"""What losing a generator costs a run today: the job ends, is requeued and resumes from its last
complete checkpoint.

A generator that dies mid-run (SIGKILL, as the out-of-memory killer kills) ends the job: rank 0
sees its lifeline end, names it and stops every rank (README, failures). Under SLURM the batch
script then requeues the job and the requeued run resumes from the newest complete checkpoint
(tests/slurm/test_rl_run.py shows that path); here the script relaunches it itself, as the requeue
would, so the figures are the system's and not the local SLURM's scheduling delay. Surviving the
loss without a restart (issue 17, part 1) is not built: on this MPI (MPICH's hydra, no ULFM) the
world does not outlive a member, so that needs the generators' traffic off MPI.

Three jobs of the tiny-cpu miniature with 2 generators (4 MPI ranks), STEPS steps, a checkpoint
every INTERVAL steps:
- clean: no fault, the reference throughput and step time;
- killed: AREAL_HPC_FAULT=generator:1:update@KILL_AT:kill, generator 1 dies when it receives the
  weights of version KILL_AT, right after that step (a step past the last checkpoint, so that the
  steps a requeue loses show);
- resumed: the same run directory with checkpoint.resume=auto.
Figures, from the jobs' exit times and the step records' wall_time:
- detection: seconds from the kill to the killed job's end;
- recovery: seconds from the kill to the first step trained past KILL_AT, and that in steps of
  the clean run;
- steps lost: steps the killed run trained past its last checkpoint, trained again;
- effective throughput (trained tokens per second) before the kill, after the recovery and
  clean, and over the whole of killed + resumed (their wall clock from the first job's start);
- the final ledger: every prompt trained exactly once, every step of B prompts.
The issue's goal is 0 steps lost and a recovery under one step.

Writes faults.json and .png under --out and prints the table.
Usage: .venv/bin/python benchmarks/faults.py [--quick] [--steps N] [--work-dir runs/faults] [--out benchmarks/results]
"""

from __future__ import annotations

import argparse
import json
import shlex
import shutil
import sys
from pathlib import Path

import rl_runs

from areal_hpc.config.load import load_config
from areal_hpc.metrics.jsonl import read_records
from areal_hpc.metrics.writer import METRICS_FILE

CONFIG = "configs/experiments/tiny-cpu.yaml"
REPORT = "faults"
STEPS = 12
QUICK_STEPS = 9
INTERVAL = 4
KILL_AT = 6
GENERATORS = 2
FAULT = "generator:{index}:update@{version}:kill"
# One step of the run's own data and reward; no held-out rounds inside the measured steps.
SHARED = ("logging.tensorboard=false", "data.synthetic_eval_size=4", "eval.n=1", "eval_interval=0")


def overrides(steps: int, interval: int, model: Path) -> list[str]:
    return [f"model.path={model}", f"total_steps={steps}", f"checkpoint.interval_steps={interval}",
            f"generator.count={GENERATORS}", *SHARED]


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


def figures(clean: list[dict], killed: list[dict], resumed: list[dict], kill_at: int,
            killed_started: float, killed_ended: float) -> dict[str, float]:
    """The recovery figures from the three jobs' step records (`killed`: as the killed job left
    them, before the resume cut its logs back; `resumed`: the resumed job's own steps)."""
    at_kill = [r for r in killed if int(r["version"]) == kill_at]
    if not at_kill:
        raise ValueError(f"the killed run trained up to version {int(killed[-1]['version']) if killed else 0},"
                         f" never {kill_at}: the fault fired elsewhere")
    kill_time = at_kill[0]["wall_time"]
    first_new = next(r for r in resumed if int(r["version"]) == kill_at + 1)
    resumed_from = int(resumed[0]["version"]) - 1
    clean_step_s = sum(r["step_s"] for r in clean[1:]) / max(1, len(clean) - 1)
    recovery_s = first_new["wall_time"] - kill_time
    last = resumed[-1]
    useful_tokens = sum(r["trained_tokens"] for r in killed if int(r["version"]) <= resumed_from) + sum(
        r["trained_tokens"] for r in resumed)
    return {
        "detection_s": killed_ended - kill_time,
        "recovery_s": recovery_s,
        "recovery_steps": recovery_s / clean_step_s,
        "steps_lost": float(max(kill_at, int(killed[-1]["version"])) - resumed_from),
        # Steps the killed job finished between the kill and its end (lost as well).
        "steps_after_kill": float(sum(1 for r in killed if int(r["version"]) > kill_at)),
        "clean_step_s": clean_step_s,
        "clean_tokens_per_s": rate(clean[1:]),
        "before_tokens_per_s": rate([r for r in killed[1:] if int(r["version"]) <= kill_at]),
        "after_tokens_per_s": rate([r for r in resumed if int(r["version"]) > kill_at + 1]),
        "whole_tokens_per_s": useful_tokens / (last["wall_time"] - killed_started),
        "clean_wall_s": clean[-1]["wall_time"] - clean[0]["wall_time"] + clean[0]["step_s"],
    }


def table(report: dict) -> str:
    f = report["figures"]
    rows = [
        ("steps lost (trained again after the requeue)", f"{f['steps_lost']:.0f}", "0"),
        ("detection: kill -> job ended", f"{f['detection_s']:.1f} s", "-"),
        ("recovery: kill -> first new step", f"{f['recovery_s']:.1f} s = {f['recovery_steps']:.1f} steps",
         "< 1 step"),
        ("effective tokens/s, clean run", f"{f['clean_tokens_per_s']:.0f}", "-"),
        ("effective tokens/s, before the kill", f"{f['before_tokens_per_s']:.0f}", "-"),
        ("effective tokens/s, after the recovery", f"{f['after_tokens_per_s']:.0f}", "= before"),
        ("effective tokens/s, killed + resumed overall", f"{f['whole_tokens_per_s']:.0f}", "= clean"),
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
    t0 = report["killed_started"]
    for name, steps, style in (("killed run", report["killed_steps"], "C3o-"),
                               ("resumed run", report["resumed_steps"], "C0o-")):
        ax.plot([r["wall_time"] - t0 for r in steps], [r["version"] for r in steps], style, label=name, ms=3)
    clean = report["clean_steps"]
    c0 = clean[0]["wall_time"] - clean[0]["step_s"] - report["clean_startup_s"]
    ax.plot([r["wall_time"] - c0 for r in clean], [r["version"] for r in clean], "C7.--", label="clean run")
    kill = next(r for r in report["killed_steps"] if int(r["version"]) == report["kill_at"])["wall_time"] - t0
    ax.axvline(kill, color="C3", lw=1, ls=":")
    ax.annotate("generator 1 killed", (kill, 0.5), fontsize=8, color="C3")
    ax.set_xlabel("wall seconds from the first job's start")
    ax.set_ylabel("policy version trained")
    f = report["figures"]
    ax.set_title(f"losing one of 2 generators: {f['steps_lost']:.0f} steps lost, recovery {f['recovery_s']:.0f} s"
                 f" ({f['recovery_steps']:.1f} steps)", fontsize=10)
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
    cfg = load_config(CONFIG, overrides(args.steps, INTERVAL, Path("model")), check_files=False)
    ranks, batch = cfg.world_size, cfg.rollout.batch_prompts
    base = overrides(args.steps, INTERVAL, rl_runs.random_model())
    command = shlex.join([".venv/bin/python", "benchmarks/faults.py", *sys.argv[1:]])
    shutil.rmtree(args.work_dir, ignore_errors=True)

    clean_dir, killed_dir = args.work_dir / "clean", args.work_dir / "killed"
    print(f"[1/3] clean run: {args.steps} steps, {GENERATORS} generators", flush=True)
    clean = rl_runs.launch(clean_dir, base, args.timeout, CONFIG, ranks)
    if clean.returncode != 0:
        raise SystemExit(f"the clean run failed ({clean.returncode}):\n{clean.stderr[-4000:]}")
    clean_steps = steps_of(read_records(clean_dir / METRICS_FILE))

    fault = FAULT.format(index=GENERATORS - 1, version=KILL_AT)
    print(f"[2/3] killed run: AREAL_HPC_FAULT={fault}", flush=True)
    killed = rl_runs.launch(killed_dir, base, args.timeout, CONFIG, ranks, env={"AREAL_HPC_FAULT": fault})
    if killed.returncode == 0:
        raise SystemExit("the killed run completed: the fault did not fire")
    killed_steps = steps_of(read_records(killed_dir / METRICS_FILE))  # before the resume cuts them back
    lost = f"(generator {GENERATORS - 1})"
    # Rank 0's words for it, else the launcher's (hydra: "KILLED BY SIGNAL: 9 (Killed)").
    output = (killed.stdout + killed.stderr).splitlines()
    named = ([line.strip() for line in output if lost in line] or
             [line.strip(" =") for line in output if "KILLED BY SIGNAL" in line])[-1:]

    print("[3/3] resumed run: checkpoint.resume=auto", flush=True)
    resumed = rl_runs.launch(killed_dir, [*base, "checkpoint.resume=auto"], args.timeout, CONFIG, ranks)
    if resumed.returncode != 0:
        raise SystemExit(f"the resumed run failed ({resumed.returncode}):\n{resumed.stderr[-4000:]}")
    resumed_steps = [r for r in steps_of(read_records(killed_dir / METRICS_FILE)) if r["wall_time"] > killed.ended]
    ledger = read_records(killed_dir / "ledger.jsonl")

    report = {
        "command": command, "config": CONFIG, "steps": args.steps, "interval": INTERVAL, "kill_at": KILL_AT,
        "fault": fault, "named": named[0] if named else None, "killed_returncode": killed.returncode,
        "figures": figures(clean_steps, killed_steps, resumed_steps, KILL_AT, killed.started, killed.ended),
        "ledger_problems": ledger_problems(ledger, args.steps, batch),
        "killed_started": killed.started, "clean_startup_s": clean_steps[0]["wall_time"] - clean.started
        - clean_steps[0]["step_s"], "jobs_s": {"clean": clean.seconds, "killed": killed.seconds,
                                                "resumed": resumed.seconds},
        "clean_steps": clean_steps, "killed_steps": killed_steps, "resumed_steps": resumed_steps,
    }
    args.out.mkdir(parents=True, exist_ok=True)
    path = args.out / f"{REPORT}.json"
    path.write_text(json.dumps(report, indent=1))
    plot(report, args.out / f"{REPORT}.png")
    print(f"named: {report['named']} (exit status {killed.returncode})")
    print(table(report))
    print(f"wrote {path} and {args.out / f'{REPORT}.png'}")


if __name__ == "__main__":
    main()

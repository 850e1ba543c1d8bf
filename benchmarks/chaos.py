"""Chaos campaigns: seeded schedules of faults against real runs, each ending with its invariants checked.

Each schedule, drawn from its seed (`draw`), is one run of the tiny-cpu miniature with 2
generators (4 MPI ranks under mpiexec with one proxy per rank, as a cluster has one per node),
`--steps` steps and a checkpoint every 2, into which 1 to 3 faults are injected, each at a step
drawn from the seed:

in place (the run goes on without a restart):
- generator-kill: a generator dies by SIGKILL as a weight update reaches it (AREAL_HPC_FAULT);
- generator-stall: a generator's main thread hangs at a generate request (AREAL_HPC_FAULT), and
  rank 0's generation deadline (watchdog.generation_s) drops it;
- engine-kill, engine-stop: SIGKILL or SIGSTOP of a generator's vLLM engine core process;
- reward-worker-kill: SIGKILL of one of a generator's reward worker processes;
- custom-reward: the reward is a custom function (chaos_reward.py) that ends its process, hangs
  past its alarm or allocates without bound on a share of its calls (reward.memory_mb 512);
ending the job, which is then run again from its last complete checkpoint (checkpoint.resume:
auto), as the SLURM scripts requeue it:
- trainer-kill: the trainer dies by SIGKILL at a step (AREAL_HPC_FAULT);
- controller-kill: SIGKILL of rank 0;
- generator-stop: SIGSTOP of a generator rank: rank 0 cuts its lifeline, it cannot leave, and
  the job ends CUT_GRACE_S later.
At most one fault of a schedule loses a generator and at most one ends the job. A hung
generator is looked for at 20 s (watchdog.generation_s) and 30 s (watchdog.weight_update_s), not
at the automatic 300 s, so that a campaign takes hours, not days; the trainer's deadlines are left
automatic.

After each schedule, checked (any that fails is a violation):
- ledger: steps 0..N-1 once each, B prompts each, every prompt of the data order once;
- metrics: metrics.jsonl parses; trained steps 1..N once each, versions increasing;
- checkpoints: every one with a COMPLETE matches its manifest;
- processes: none of the job's (ranks, engines, reward workers, sandboxes) left running;
- exit: rank 0's exit status is 0 for the run that finished and not 0 for one a job-ending fault
  ended; no run outlives its timeout.
Figures: faults injected and survived by kind, violations, steps lost (trained by an ended run
past the checkpoint the next one resumed from), recovery (after a job-ending fault, from the ended
run's last step to the first step past it in the resumed run; in place, the longest gap between
two steps less the median one).

Writes chaos.json (top-level `schedules` and `violations`, then the rest) and chaos.png under
--out and prints the table.
Usage: .venv/bin/python benchmarks/chaos.py [--quick] [--schedules N] [--seed S] [--steps N]
       [--work-dir runs/chaos] [--out benchmarks/results]
"""

from __future__ import annotations

import argparse
import json
import os
import random
import shlex
import shutil
import signal
import statistics
import subprocess
import sys
import time
from collections import Counter
from dataclasses import asdict, dataclass, field
from pathlib import Path

import rl_runs
from faults import ledger_problems

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))
from job_processes import MARKER, job_groups, leftovers, rank_pid  # noqa: E402

from areal_hpc.config.load import load_config  # noqa: E402
from areal_hpc.controller import checkpoint as ck  # noqa: E402
from areal_hpc.launch import mpiexec_surviving_loss  # noqa: E402
from areal_hpc.metrics.jsonl import read_records  # noqa: E402
from areal_hpc.metrics.writer import METRICS_FILE  # noqa: E402
from areal_hpc.runtime.world import EXIT_FILE_ENV  # noqa: E402

CONFIG = "configs/experiments/tiny-cpu.yaml"
REPORT = "chaos"
GENERATORS = 2
STEPS, QUICK_STEPS = 10, 8
SCHEDULES, QUICK_SCHEDULES = 50, 2
# The quick campaign's first seed: its 2 schedules end one job (a trainer killed) and kill a
# generator's engine in place, each with a reward worker killed.
QUICK_SEED = 12
IN_PLACE = ("generator-kill", "generator-stall", "engine-kill", "engine-stop", "reward-worker-kill", "custom-reward")
ENDING = ("trainer-kill", "controller-kill", "generator-stop")
LOSES_GENERATOR = {"generator-kill", "generator-stall", "engine-kill", "engine-stop"}
# Faults made by the run itself (AREAL_HPC_FAULT); the others are signals sent from here.
BY_ENV = {"generator-kill": "generator:{g}:update@{step}:kill", "generator-stall": "generator:{g}:request@{n}:stall",
          "trainer-kill": "trainer:0:step@{step}:kill"}
# Generate requests (one per prompt) a generator gets per step of the miniature (batch_prompts 8
# over 2 generators), for request@n.
REQUESTS_PER_STEP = 4
REWARD_FAULT_RATE = 0.05
SHARED = ("logging.tensorboard=false", "data.synthetic_eval_size=4", "eval.n=1", "eval_interval=0",
          "checkpoint.interval_steps=2", "rollout.max_new_tokens=64", "watchdog.generation_s=20",
          "watchdog.weight_update_s=30")
CUSTOM = ("reward.kind=custom", "reward.function=benchmarks/chaos_reward.py:score", "reward.memory_mb=512",
          "reward.timeout_s=2")
# Seconds after a run ended before its processes must be gone.
SETTLE_S = 5.0


@dataclass(frozen=True)
class Injection:
    kind: str
    step: int  # injected once this many steps are trained (an update: as version `step` reaches it)
    generator: int  # the generator it targets, where it targets one


def draw(seed: int, steps: int) -> list[Injection]:
    """1 to 3 faults at steps 2..steps-3: at most one loses a generator, at most one ends the job,
    one custom-reward at most; a job-ending fault on a generator targets one not lost before."""
    rng = random.Random(seed)
    count, out = rng.randint(1, 3), []
    while len(out) < count:
        kind = rng.choice(IN_PLACE + ENDING)
        kinds = {i.kind for i in out}
        if (kind in LOSES_GENERATOR and kinds & LOSES_GENERATOR) or (kind in ENDING and kinds & set(ENDING)) \
                or (kind == "custom-reward" and kind in kinds):
            continue
        out.append(Injection(kind, rng.randint(2, steps - 3), rng.randrange(GENERATORS)))
    lost = {i.generator for i in out if i.kind in LOSES_GENERATOR}
    out = [Injection(i.kind, i.step, 1 - i.generator) if i.kind == "generator-stop" and i.generator in lost else i
           for i in out]
    return sorted(out, key=lambda i: (i.step, i.kind))


def fault_env(injections: list[Injection]) -> str:
    """AREAL_HPC_FAULT for the faults the run makes itself."""
    return ",".join(BY_ENV[i.kind].format(g=i.generator, step=i.step, n=i.step * REQUESTS_PER_STEP)
                    for i in injections if i.kind in BY_ENV)


@dataclass
class Attempt:
    """One job of a schedule: the first, or one resumed after a job-ending fault."""

    returncode: int
    rank0_exit: int | None  # None: rank 0 wrote no exit status (it was killed, or the job aborted)
    seconds: float
    timed_out: bool
    trained: int  # steps trained when it ended
    last_step_at: float  # wall time of its last trained step (0: none)
    resumed_from: int  # the checkpoint version it resumed from (0: none)
    injected: list[str] = field(default_factory=list)
    output_tail: str = ""


def rank_of_generator(world_size: int, g: int) -> int:
    return world_size - GENERATORS + g


def processes_of(marker: str, rank: int, name: bytes) -> list[int]:
    """The processes in `rank`'s process group whose command line contains `name` (by group, not
    by the job's marker: vLLM's engine core writes its title over its environment)."""
    try:
        group = os.getpgid(rank_pid(rank, marker))
    except (LookupError, ProcessLookupError):
        return []
    found = []
    for p in Path("/proc").iterdir():
        try:
            if p.name.isdigit() and os.getpgid(int(p.name)) == group and name in (p / "cmdline").read_bytes():
                found.append(int(p.name))
        except (ProcessLookupError, OSError):
            continue
    return found


def send(injection: Injection, marker: str, world_size: int) -> bool:
    """Send a signal fault; False when its target is not there (a generator already lost)."""
    rank = rank_of_generator(world_size, injection.generator)
    targets = {
        "engine-kill": (processes_of(marker, rank, b"VLLM::EngineCore"), signal.SIGKILL),
        "engine-stop": (processes_of(marker, rank, b"VLLM::EngineCore"), signal.SIGSTOP),
        "reward-worker-kill": (processes_of(marker, rank, b"areal_hpc.reward.worker")[:1], signal.SIGKILL),
        "controller-kill": (_rank(marker, 0), signal.SIGKILL),
        "generator-stop": (_rank(marker, rank), signal.SIGSTOP),
    }[injection.kind]
    pids, sig = targets
    for pid in pids:
        try:
            os.kill(pid, sig)
        except ProcessLookupError:
            return False
    return bool(pids)


def _rank(marker: str, rank: int) -> list[int]:
    try:
        return [rank_pid(rank, marker)]
    except LookupError:
        return []


def step_records(run_dir: Path) -> list[dict]:
    try:
        return [r for r in read_records(run_dir / METRICS_FILE) if "trained_tokens" in r]
    except (OSError, ValueError):
        return []


def resumed_version(run_dir: Path) -> int:
    latest = ck.latest_complete(run_dir / "checkpoints")
    return 0 if latest is None else ck.ControllerState.load(latest).version


def run_attempt(run_dir: Path, n: int, overrides: list[str], injections: list[Injection], env: dict[str, str],
                world_size: int, timeout: float) -> tuple[Attempt, set[int], str]:
    """Job `n` of a schedule, the signal faults sent as their steps are reached; returns it, the
    process groups its ranks had (for the check that nothing is left) and its output."""
    exit_file, log_path = run_dir.parent / f"{run_dir.name}.{n}.exit", run_dir.parent / f"{run_dir.name}.{n}.log"
    exit_file.unlink(missing_ok=True)
    resumed_from = resumed_version(run_dir)
    cmd = rl_runs.command(run_dir, overrides, CONFIG, world_size, mpiexec_surviving_loss(world_size))
    full_env = rl_runs.environment({**env, EXIT_FILE_ENV: str(exit_file)})
    pending = [i for i in injections if i.kind not in BY_ENV]
    injected, groups = [i.kind for i in injections if i.kind in BY_ENV], set()
    started = time.monotonic()
    with log_path.open("w") as log:
        proc = subprocess.Popen(cmd, env=full_env, stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
        timed_out = False
        while proc.poll() is None:
            groups |= job_groups(env[MARKER])
            done = len(step_records(run_dir))
            for i in [i for i in pending if i.step <= done]:
                pending.remove(i)
                if send(i, env[MARKER], world_size):
                    injected.append(i.kind)
            if time.monotonic() - started > timeout:
                os.killpg(proc.pid, signal.SIGKILL)
                timed_out = True
            time.sleep(0.5)
    output = log_path.read_text(errors="replace")
    rank0 = int(exit_file.read_text()) if exit_file.is_file() else None
    steps = step_records(run_dir)
    return Attempt(proc.returncode, rank0, time.monotonic() - started, timed_out, len(steps),
                   steps[-1]["wall_time"] if steps else 0.0, resumed_from, injected, output[-6000:]), groups, output


def fired(kind: str, generator: int, world_size: int, output: str) -> bool:
    """Whether a fault the run makes itself happened, by rank 0's account of it."""
    lines = output.splitlines()
    if kind == "trainer-kill":
        return any("rank 1 (trainer 0)" in line for line in lines)
    named = f"rank {rank_of_generator(world_size, generator)} (generator {generator})"
    return any(named in line and "going on without it" in line for line in lines)


# ---- the invariants (pure but for reading the run directory) ------------------------------------

def invariant_problems(run_dir: Path, steps: int, batch: int, attempts: list[Attempt],
                       ended_by_fault: list[bool], left: list[int]) -> list[str]:
    found = []
    try:
        ledger = read_records(run_dir / "ledger.jsonl")
        found += [f"ledger: {p}" for p in ledger_problems(ledger, steps, batch)]
        ids = sorted(pid for e in ledger for pid in e["prompt_ids"])
        if ids != list(range(steps * batch)):
            found.append(f"ledger: the prompts trained are not the first {steps * batch} of the data order once each")
    except (OSError, ValueError, KeyError) as e:
        found.append(f"ledger: unreadable ({e})")
    try:
        records = [r for r in read_records(run_dir / METRICS_FILE) if "trained_tokens" in r]
        if [r["step"] for r in records] != list(range(1, steps + 1)):
            found.append(f"metrics: trained steps {[r['step'] for r in records]}, not 1..{steps} once each")
        versions = [r["version"] for r in records]
        if any(b <= a for a, b in zip(versions, versions[1:], strict=False)):
            found.append(f"metrics: versions {versions} do not increase")
    except (OSError, ValueError, KeyError) as e:
        found.append(f"metrics: unreadable ({e})")
    for d in sorted((run_dir / "checkpoints").glob(f"{ck.PREFIX}*")):
        if ck.is_complete(d) and ck.problems(d):
            found.append(f"checkpoint {d.name}: {'; '.join(ck.problems(d)[:3])}")
    if left:
        found.append(f"processes: {len(left)} of the job still running after it ended")
    for n, (a, by_fault) in enumerate(zip(attempts, ended_by_fault, strict=True), 1):
        if a.timed_out:
            found.append(f"run {n}: still running after its timeout")
        elif by_fault and a.rank0_exit == 0:
            found.append(f"run {n}: rank 0 exited 0 although a fault ended the job")
        elif not by_fault and a.rank0_exit != 0:
            found.append(f"run {n}: rank 0's exit status {a.rank0_exit}, not 0")
    return found


def recovery_s(records: list[dict], attempts: list[Attempt]) -> float:
    """After a job-ending fault: seconds from the ended job's last step to the first step past it
    in the resumed one (detection, restart, start-up, the steps trained again). In place: the
    longest gap between two trained steps less the median one (0 with fewer than 3 steps)."""
    walls = [r["wall_time"] for r in records]
    if len(attempts) > 1:
        past = [r["wall_time"] for r in records if r["step"] > attempts[0].trained]
        return past[0] - attempts[0].last_step_at if past and attempts[0].trained else 0.0
    gaps = [b - a for a, b in zip(walls, walls[1:], strict=False)]
    return max(gaps) - statistics.median(gaps) if len(gaps) >= 2 else 0.0


def run_schedule(seed: int, steps: int, model: Path, work_dir: Path, timeout: float) -> dict:
    injections = draw(seed, steps)
    run_dir = work_dir / f"seed-{seed}"
    shutil.rmtree(run_dir, ignore_errors=True)
    run_dir.parent.mkdir(parents=True, exist_ok=True)
    custom = any(i.kind == "custom-reward" for i in injections)
    overrides = [f"model.path={model}", f"total_steps={steps}", f"generator.count={GENERATORS}",
                 f"cluster.rollout_nodes={GENERATORS}", *SHARED, *(CUSTOM if custom else ())]
    cfg = load_config(CONFIG, overrides, check_files=False)
    marker = f"chaos-{seed}-{os.getpid()}"
    env = {MARKER: marker, "CHAOS_REWARD_FAULT_RATE": str(REWARD_FAULT_RATE if custom else 0.0)}
    faults = fault_env(injections)
    attempts, ended_by_fault, groups = [], [], set()
    first, g, output = run_attempt(run_dir, 1, overrides, [i for i in injections if i.kind != "custom-reward"],
                                   {**env, "AREAL_HPC_FAULT": faults} if faults else env, cfg.world_size, timeout)
    first.injected = [i.kind for i in injections if i.kind == "custom-reward"] + [
        k for k in first.injected
        if k not in BY_ENV or fired(k, next(i.generator for i in injections if i.kind == k), cfg.world_size, output)]
    attempts.append(first)
    groups |= g
    ending = any(k in ENDING for k in first.injected)
    ended_by_fault.append(ending)
    if ending and not first.timed_out:
        again, g, _ = run_attempt(run_dir, 2, [*overrides, "checkpoint.resume=auto"], [], env, cfg.world_size,
                                  timeout)
        attempts.append(again)
        ended_by_fault.append(False)
        groups |= g
    time.sleep(SETTLE_S)
    left = leftovers(marker, groups)
    for pid in left:
        try:
            os.kill(pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
    violations = invariant_problems(run_dir, steps, cfg.rollout.batch_prompts, attempts, ended_by_fault, left)
    lost = sum(max(0, a.trained - b.resumed_from) for a, b in zip(attempts, attempts[1:], strict=False))
    return {
        "seed": seed, "drawn": [asdict(i) for i in injections], "injected": [k for a in attempts for k in a.injected],
        "runs": len(attempts), "violations": violations, "steps_lost": lost, "recovery_s": recovery_s(step_records(run_dir), attempts),
        "seconds": sum(a.seconds for a in attempts),
        "attempts": [{k: v for k, v in asdict(a).items() if k != "output_tail"} for a in attempts],
        "output_tail": portable(attempts[-1].output_tail[-2000:]) if violations else "",
    }


# ---- the report -------------------------------------------------------------------------------

def by_kind(schedules: list[dict]) -> dict[str, dict[str, int]]:
    """Faults injected by kind, and how many of those were in schedules that held every invariant."""
    out: dict[str, dict[str, int]] = {}
    for s in schedules:
        for kind, n in Counter(s["injected"]).items():
            row = out.setdefault(kind, {"injected": 0, "survived": 0})
            row["injected"] += n
            row["survived"] += n if not s["violations"] else 0
    return dict(sorted(out.items()))


def summary(schedules: list[dict], command: str, steps: int) -> dict:
    violations = sum(len(s["violations"]) for s in schedules)
    return {
        "schedules": len(schedules), "violations": violations, "command": command, "config": CONFIG,
        "steps": steps, "by_kind": by_kind(schedules),
        "steps_lost": sum(s["steps_lost"] for s in schedules),
        "recovery_s_max": max((s["recovery_s"] for s in schedules), default=0.0),
        "recovery_s_median": statistics.median([s["recovery_s"] for s in schedules]) if schedules else 0.0,
        "schedules_detail": schedules,
    }


def portable(text: str) -> str:
    """`text` without this machine's paths: the repository's and the interpreter's own."""
    for root, name in ((str(Path(__file__).resolve().parent.parent) + "/", ""),
                       (sys.base_prefix + "/", "<python>/"), (sys.prefix + "/", "<venv>/")):
        text = text.replace(root, name)
    return text


def table(report: dict) -> str:
    lines = [f"{'fault':<20} {'injected':>8} {'survived':>8}"]
    lines += [f"{k:<20} {v['injected']:>8} {v['survived']:>8}" for k, v in report["by_kind"].items()]
    lines.append(f"schedules {report['schedules']}, invariant violations {report['violations']} (goal 0),"
                 f" steps lost {report['steps_lost']}, recovery median {report['recovery_s_median']:.1f} s,"
                 f" max {report['recovery_s_max']:.1f} s")
    return "\n".join(lines)


def plot(report: dict, path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    kinds = list(report["by_kind"])
    fig, (left, right) = plt.subplots(1, 2, figsize=(11, 4))
    x = range(len(kinds))
    left.bar([i - 0.2 for i in x], [report["by_kind"][k]["injected"] for k in kinds], 0.4, label="injected")
    left.bar([i + 0.2 for i in x], [report["by_kind"][k]["survived"] for k in kinds], 0.4, label="survived")
    left.set_xticks(list(x), kinds, rotation=30, ha="right")
    left.set_title(f"{report['schedules']} schedules, {report['violations']} invariant violations")
    left.legend()
    detail = report["schedules_detail"]
    right.scatter([s["steps_lost"] for s in detail], [s["recovery_s"] for s in detail])
    right.set_xlabel("steps lost (trained again after a restart)")
    right.set_ylabel("recovery, s (longest step gap - median)")
    right.set_title("per schedule")
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--quick", action="store_true", help=f"{QUICK_SCHEDULES} schedules of {QUICK_STEPS} steps")
    p.add_argument("--schedules", type=int, default=None, help=f"default {SCHEDULES}")
    p.add_argument("--seed", type=int, default=None, help=f"first seed (default 0; --quick {QUICK_SEED})")
    p.add_argument("--steps", type=int, default=None, help=f"steps per run (default {STEPS}, --quick {QUICK_STEPS})")
    p.add_argument("--work-dir", type=Path, default=Path("runs/chaos"))
    p.add_argument("--out", type=Path, default=Path(__file__).parent / "results")
    p.add_argument("--timeout", type=float, default=900.0, help="seconds one job may take")
    args = p.parse_args()
    count = args.schedules or (QUICK_SCHEDULES if args.quick else SCHEDULES)
    first_seed = args.seed if args.seed is not None else (QUICK_SEED if args.quick else 0)
    steps = args.steps or (QUICK_STEPS if args.quick else STEPS)
    if steps < 6:
        p.error(f"--steps {steps}: at least 6, so faults land between checkpoints and steps follow them")
    model = rl_runs.random_model()
    command = shlex.join([".venv/bin/python", "benchmarks/chaos.py", *sys.argv[1:]])
    args.out.mkdir(parents=True, exist_ok=True)
    schedules = []
    for n, seed in enumerate(range(first_seed, first_seed + count), 1):
        kinds = ", ".join(f"{i.kind}@{i.step}" for i in draw(seed, steps))
        print(f"[{n}/{count}] seed {seed}: {kinds}", flush=True)
        s = run_schedule(seed, steps, model, args.work_dir, args.timeout)
        schedules.append(s)
        verdict = "held" if not s["violations"] else "VIOLATED: " + "; ".join(s["violations"])
        print(f"  {s['runs']} run(s), {s['seconds']:.0f} s, injected {s['injected']}, steps lost {s['steps_lost']},"
              f" recovery {s['recovery_s']:.1f} s: {verdict}", flush=True)
        report = summary(schedules, command, steps)  # written after every schedule: a long campaign's partial
        (args.out / f"{REPORT}.json").write_text(json.dumps(report, indent=1))
    plot(report, args.out / f"{REPORT}.png")
    print(table(report))
    if report["violations"]:
        print(f"MISSED: {report['violations']} invariant violations (goal 0)")
    print(f"wrote {args.out / f'{REPORT}.json'} and {args.out / f'{REPORT}.png'}")
    sys.exit(1 if report["violations"] else 0)


if __name__ == "__main__":
    main()

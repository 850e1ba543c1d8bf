"""The paper's Tables 1 and 2 in miniature: held-out accuracy against the staleness bound eta, with
and without the decoupled PPO objective, and synchronous against asynchronous RL over wall-clock.

Every run is the quickstart job (tiny Qwen2, synthetic arithmetic, 3 MPI ranks), run one after the
other. The grid is eta x objective x seed; eta 0 runs once per seed (standard PPO: with no stale
data pi_prox is pi_behav, so the objectives coincide and a synchronous system recomputes nothing).
"inf" is eta = the run's steps, a bound no run reaches (any eta >= steps - 1 admits every prompt of
the run at once, so it is unbounded too). A seed is the whole pipeline: its own
warm-started model (cached under .cache/, minutes the first time), data order, held-out set and
sampling; within a seed every run shares the model, held-out prompts and evaluation seeds, so
differences between runs are paired by seed. In-flight prompts are capped at
batch_prompts x (eta + 1) so that each eta can be reached.

Table 2: final held-out accuracy (avg@n over eval prompts x n samples) per eta and objective, mean
and standard error over seeds; the change against eta 0 paired by seed (by prompt with one seed).
How far successive versions move apart is train/approx_kl, the k3 estimate of KL(anchor ||
pi_theta) averaged over a step's minibatches (each measured before its update): the anchor is
pi_prox, the step's starting version, for the decoupled objective, and pi_behav, the versions that
sampled the tokens, for standard PPO; at eta 0 both are the previous version, so the eta-0 runs'
value is the KL between successive versions of the setting. --lr and --minibatches raise it.
Table 1: eta 0 against the decoupled objective's best eta (the same steps): accuracy against wall
seconds of training (metrics elapsed_s; held-out rounds during training count in both), the final
accuracies and the wall-clock ratio to first reach the synchronous run's final accuracy (linear
between evaluations, on the seed-mean curves).

Each run has its own logging.dir under --work-dir, named by its settings; a finished run leaves
result.json there and is reused when the script runs again with the same settings, so a grid can
be resumed. staleness_quality.json keeps one entry per setting (the shared options; another --lr
or --minibatches adds an entry, the same one replaces its own) with every run's per-seed values
and the command; the PNG has one row per entry.

Writes staleness_quality.json and .png under --out and prints the tables.
Usage: .venv/bin/python benchmarks/staleness_quality.py [--quick] [--etas 0,1,2,4,8,16,inf]
       [--objectives decoupled,standard] [--seeds N] [--steps N] [--lr X] [--minibatches N]
       [--work-dir runs/staleness_quality] [--out benchmarks/results]
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import math
import shlex
import sys
from pathlib import Path
from statistics import mean, stdev

import rl_runs

from areal_hpc.errors import ConfigError
from areal_hpc.metrics.report import eval_accuracies, paired_gain
from areal_hpc.recipes.warm_start import RESERVED_HELD_OUT, cache_dir, ensure_prepared
from areal_hpc.sim.paper_numbers import TABLE2_1P5B

OBJECTIVES = ("decoupled", "standard")
RESULT_FILE = "result.json"
REPORT = "staleness_quality"


@dataclasses.dataclass(frozen=True)
class Settings:
    """One grid: what every run shares (the setting, `key`) and the grid's etas, objectives, seeds.
    An eta of None is unbounded (eta = steps)."""

    steps: int
    batch_prompts: int
    group_size: int
    eval_prompts: int
    eval_samples: int
    eval_interval: int
    lr: float
    minibatches: int
    seeds: int
    etas: tuple[int | None, ...]
    objectives: tuple[str, ...]

    @property
    def key(self) -> str:
        return (f"s{self.steps}-b{self.batch_prompts}x{self.group_size}-eval{self.eval_prompts}x{self.eval_samples}"
                f"i{self.eval_interval}-lr{self.lr:g}-mb{self.minibatches}")

    def eta_value(self, eta: int | None) -> int:
        return self.steps if eta is None else eta


# The full grid (39 runs, each about 40 s of start-up and held-out rounds plus 2 s a step on an
# idle 2-core machine: under 90 minutes with two new seeds' warm starts) and --quick's subset (10
# runs); 20 steps so that eta 16 stays below unbounded. --lr and --minibatches default to the
# quickstart config's.
FULL = {"steps": 20, "batch_prompts": 16, "group_size": 8, "eval_prompts": 64, "eval_samples": 16,
        "eval_interval": 5, "seeds": 3, "etas": (0, 1, 2, 4, 8, 16, None), "objectives": OBJECTIVES}
QUICK = {**FULL, "steps": 4, "eval_prompts": 32, "eval_samples": 8, "eval_interval": 2, "seeds": 2,
         "etas": (0, 4, 16)}


def eta_label(eta: int | None) -> str:
    return "inf" if eta is None else str(eta)


def parse_etas(text: str) -> tuple[int | None, ...]:
    """'0,4,inf' -> (0, 4, None); eta 0 is required (every comparison is against it)."""
    etas: list[int | None] = []
    for part in text.split(","):
        part = part.strip()
        if part == "inf":
            etas.append(None)
        elif part.isdigit():
            etas.append(int(part))
        else:
            raise argparse.ArgumentTypeError(f"eta {part!r}: a whole number >= 0 or inf")
    if len(set(etas)) != len(etas):
        raise argparse.ArgumentTypeError(f"--etas {text}: an eta is listed twice")
    if 0 not in etas:
        raise argparse.ArgumentTypeError(f"--etas {text}: must include 0, the synchronous baseline")
    return tuple(sorted(etas, key=lambda e: math.inf if e is None else e))


def parse_objectives(text: str) -> tuple[str, ...]:
    names = tuple(dict.fromkeys(p.strip() for p in text.split(",")))
    bad = [n for n in names if n not in OBJECTIVES]
    if bad or not names:
        raise argparse.ArgumentTypeError(f"--objectives {text}: choose from {', '.join(OBJECTIVES)}")
    return names


def positive(text: str) -> int:
    if not text.isdigit() or int(text) < 1:
        raise argparse.ArgumentTypeError(f"{text!r}: a whole number >= 1")
    return int(text)


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--quick", action="store_true", help="eta 0, 4, 16 x both objectives x 2 seeds, 4 steps")
    p.add_argument("--etas", type=parse_etas, help="comma-separated, 'inf' for unbounded (default 0,1,2,4,8,16,inf)")
    p.add_argument("--objectives", type=parse_objectives, help="decoupled, standard or both (default both)")
    p.add_argument("--seeds", type=positive, help="seeds per configuration (default 3)")
    p.add_argument("--steps", type=positive, help="training steps per run (default 20)")
    p.add_argument("--batch-prompts", type=positive, help="prompts per step (default 16)")
    p.add_argument("--group-size", type=positive, help="samples per prompt (default 8)")
    p.add_argument("--eval-prompts", type=positive, help=f"held-out prompts, at most {RESERVED_HELD_OUT} (default 64)")
    p.add_argument("--eval-samples", type=positive, help="samples per held-out prompt (default 16)")
    p.add_argument("--eval-interval", type=int, help="evaluate every this many steps, 0: start and end (default 5)")
    p.add_argument("--lr", type=float, help="optimizer.lr (default: the quickstart config's)")
    p.add_argument("--minibatches", type=positive, help="ppo.minibatches (default: the quickstart config's)")
    p.add_argument("--work-dir", type=Path, default=Path("runs/staleness_quality"), help="one run directory per run")
    p.add_argument("--out", type=Path, default=Path(__file__).parent / "results")
    return p


def resolve(args: argparse.Namespace, config_lr: float, config_minibatches: int) -> Settings:
    """The grid the arguments ask for: --quick's or the full defaults, each flag given overriding."""
    base = QUICK if args.quick else FULL
    given = {f.name: getattr(args, f.name) for f in dataclasses.fields(Settings) if getattr(args, f.name) is not None}
    s = Settings(**{"lr": config_lr, "minibatches": config_minibatches, **base, **given})
    if s.eval_prompts > RESERVED_HELD_OUT:
        # More held-out prompts than the warm start keeps out of its SFT data would need new models.
        raise argparse.ArgumentTypeError(f"--eval-prompts {s.eval_prompts}: at most {RESERVED_HELD_OUT}")
    return s


def check_runs(s: Settings) -> None:
    """Every run's config passes the project's checks (ConfigError naming the key) before the first
    run starts, so a bad --lr or --minibatches does not wait for a warm start."""
    for eta, objective in dict.fromkeys((e, o) for _, e, o in grid(s)):
        rl_runs.load_config(rl_runs.CONFIG, overrides(s, Path("model"), 1, eta, objective), check_files=False)


def grid(s: Settings) -> list[tuple[int, int | None, str]]:
    """(seed index, eta, objective) in run order, seed by seed so that a partial grid is whole seeds;
    eta 0 once per seed, as "standard"."""
    return [(seed, eta, obj) for seed in range(s.seeds) for eta in s.etas
            for obj in (("standard",) if eta == 0 else s.objectives)]


def run_name(seed: int, eta: int | None, objective: str) -> str:
    return f"seed{seed}-eta{eta_label(eta)}-{objective}"


def overrides(s: Settings, model: Path, seed: int, eta: int | None, objective: str) -> list[str]:
    """The run's config overrides (the run's identity for reuse)."""
    e = s.eta_value(eta)
    return [f"model.path={model}", f"seed={seed}", f"rollout.eta={e}", f"ppo.decoupled={str(objective == 'decoupled').lower()}",
            f"total_steps={s.steps}", f"rollout.batch_prompts={s.batch_prompts}", f"rollout.group_size={s.group_size}",
            f"rollout.max_concurrent={s.batch_prompts * (e + 1)}", f"data.synthetic_eval_size={s.eval_prompts}",
            f"eval.n={s.eval_samples}", f"eval_interval={s.eval_interval}", f"optimizer.lr={s.lr}",
            f"ppo.minibatches={s.minibatches}", "checkpoint.interval_steps=0"]


# ---- one run's values (pure) ------------------------------------------------------------------


def _mean_of(records: list[dict], key: str) -> float | None:
    values = [r[key] for r in records if key in r]
    return mean(values) if values else None


def summarize_run(records: list[dict], per_prompt: list[dict[int, float]]) -> dict:
    """A finished run's values from its metrics records and its held-out rounds' per-prompt
    accuracies (eval/version-*.jsonl, in version order)."""
    steps, evals = rl_runs.steps(records), rl_runs.evals(records)
    if not steps or len(evals) < 2 or len(per_prompt) < 2:
        raise ValueError(f"a run needs steps and two held-out rounds: {len(steps)} steps, {len(evals)} rounds")
    elapsed = {0: 0.0, **{r["step"]: r["elapsed_s"] for r in steps}}
    last = evals[-1]
    widest = max((k for k in last if k.startswith("eval_pass@")), key=lambda k: int(k.split("@")[1]), default=None)
    gain = paired_gain(per_prompt[0], per_prompt[-1])
    return {
        "first": evals[0]["eval_accuracy"],
        "final": last["eval_accuracy"],
        "final_pass_at_n": last[widest] if widest else None,
        "pass_n": int(widest.split("@")[1]) if widest else None,
        "gain": None if gain is None else gain.gain,
        "gain_se": None if gain is None else gain.stderr,
        "curve": [{"version": r["step"], "accuracy": r["eval_accuracy"], "elapsed_s": elapsed.get(r["step"])}
                  for r in evals],
        "wall_s": steps[-1]["elapsed_s"],
        "approx_kl": _mean_of(steps, "train/approx_kl"),
        "importance_weight_max": _mean_of(steps, "train/importance_weight_max"),
        "masked_fraction": _mean_of(steps, "train/masked_fraction"),
        "clip_fraction": _mean_of(steps, "train/clip_fraction"),
        "staleness_mean": _mean_of(steps, "staleness_mean"),
        "staleness_max": max(r["staleness_max"] for r in steps),
        "reward_first": steps[0]["reward_mean"],
        "reward_last": steps[-1]["reward_mean"],
        "final_per_prompt": {str(k): v for k, v in sorted(per_prompt[-1].items())},
    }


# ---- the grid's tables (pure) -----------------------------------------------------------------


def mean_se(values: list[float]) -> tuple[float, float | None]:
    return mean(values), (stdev(values) / math.sqrt(len(values)) if len(values) > 1 else None)


def cell_runs(runs: list[dict], eta: str, objective: str) -> dict[int, dict]:
    """Seed -> run of one cell of Table 2; eta 0's runs belong to both objectives."""
    return {r["seed"]: r for r in runs if r["eta"] == eta and (eta == "0" or r["objective"] == objective)}


def paired_difference(a: dict[int, dict], b: dict[int, dict]) -> dict | None:
    """Final accuracy of b minus a over their common seeds: mean and standard error over seeds, or
    with one seed the per-prompt paired standard error."""
    seeds = sorted(a.keys() & b.keys())
    if not seeds:
        return None
    if len(seeds) > 1:
        m, se = mean_se([b[s]["final"] - a[s]["final"] for s in seeds])
        return {"diff": m, "se": se, "over": "seeds", "n": len(seeds)}
    first = {int(k): v for k, v in a[seeds[0]]["final_per_prompt"].items()}
    last = {int(k): v for k, v in b[seeds[0]]["final_per_prompt"].items()}
    g = paired_gain(first, last)
    if g is None:
        return None
    return {"diff": g.gain, "se": g.stderr, "over": "prompts", "n": g.prompts}


def table2(runs: list[dict], etas: list[str]) -> list[dict]:
    """Per eta, each objective's final accuracy over seeds and its drift; eta 0 starts both lines."""
    rows = []
    base = cell_runs(runs, "0", "standard")
    for eta in etas:
        row: dict = {"eta": eta}
        for obj in OBJECTIVES:
            cell = cell_runs(runs, eta, obj)
            if not cell:
                continue
            acc, se = mean_se([r["final"] for r in cell.values()])
            kl = [r["approx_kl"] for r in cell.values() if r["approx_kl"] is not None]
            row[obj] = {"accuracy": acc, "se": se, "seeds": len(cell), "vs_eta0": paired_difference(base, cell),
                        "pass_at_n": mean([r["final_pass_at_n"] for r in cell.values()]) if all(
                            r["final_pass_at_n"] is not None for r in cell.values()) else None,
                        "approx_kl": mean(kl) if kl else None,
                        "staleness_mean": mean(r["staleness_mean"] for r in cell.values()),
                        "masked_fraction": mean(r["masked_fraction"] or 0.0 for r in cell.values())}
        if all(o in row for o in OBJECTIVES) and eta != "0":
            row["decoupled_minus_standard"] = paired_difference(cell_runs(runs, eta, "standard"),
                                                                cell_runs(runs, eta, "decoupled"))
        rows.append(row)
    return rows


def mean_curve(cell: dict[int, dict]) -> list[dict]:
    """Seed-mean accuracy and wall seconds at each version every seed evaluated."""
    by_seed = [{p["version"]: p for p in r["curve"] if p["elapsed_s"] is not None} for r in cell.values()]
    versions = sorted(set.intersection(*(set(c) for c in by_seed))) if by_seed else []
    out = []
    for v in versions:
        acc, se = mean_se([c[v]["accuracy"] for c in by_seed])
        out.append({"version": v, "accuracy": acc, "se": se, "elapsed_s": mean(c[v]["elapsed_s"] for c in by_seed)})
    return out


def time_to_reach(curve: list[dict], target: float) -> float | None:
    """First wall second at which the curve reaches `target`, linear between evaluations."""
    for before, point in zip([None, *curve], curve, strict=False):
        if point["accuracy"] >= target:
            if before is None or point["accuracy"] == before["accuracy"]:
                return point["elapsed_s"]
            f = (target - before["accuracy"]) / (point["accuracy"] - before["accuracy"])
            return before["elapsed_s"] + f * (point["elapsed_s"] - before["elapsed_s"])
    return None


def table1(runs: list[dict], etas: list[str]) -> dict | None:
    """eta 0 against the best eta > 0 of the decoupled objective (of standard PPO if only that ran)."""
    sync = cell_runs(runs, "0", "standard")
    objective = "decoupled" if any(r["objective"] == "decoupled" for r in runs) else "standard"
    cells = {e: cell_runs(runs, e, objective) for e in etas if e != "0"}
    cells = {e: c for e, c in cells.items() if c}
    if not sync or not cells:
        return None
    best = max(cells, key=lambda e: mean(r["final"] for r in cells[e].values()))
    out: dict = {"objective": objective, "best_eta": best}
    for name, cell in (("sync", sync), ("async", cells[best])):
        acc, se = mean_se([r["final"] for r in cell.values()])
        out[name] = {"accuracy": acc, "se": se, "wall_s": mean(r["wall_s"] for r in cell.values()),
                     "curve": mean_curve(cell)}
    target = out["sync"]["accuracy"]
    t_sync, t_async = time_to_reach(out["sync"]["curve"], target), time_to_reach(out["async"]["curve"], target)
    out.update(target=target, sync_time_to_target_s=t_sync, async_time_to_target_s=t_async,
               time_to_target_ratio=t_sync / t_async if t_sync and t_async else None,
               same_steps_wall_ratio=out["sync"]["wall_s"] / out["async"]["wall_s"],
               vs_sync=paired_difference(sync, cells[best]))
    return out


def start(runs: list[dict]) -> dict | None:
    """Held-out accuracy before RL (the eta-0 runs' first round; every run of a seed shares it)."""
    first = [r["first"] for r in runs if r["eta"] == "0"]
    if not first:
        return None
    acc, se = mean_se(first)
    return {"accuracy": acc, "se": se}


def drift(runs: list[dict]) -> float | None:
    """The setting's KL between successive versions: the eta-0 runs' mean train/approx_kl."""
    kl = [r["approx_kl"] for r in runs if r["eta"] == "0" and r["approx_kl"] is not None]
    return mean(kl) if kl else None


def _pm(x: float | None, se: float | None, digits: int = 3) -> str:
    if x is None:
        return "-"
    return f"{x:+.{digits}f}" + ("" if se is None else f" +- {se:.{digits}f}")


def _acc(cell: dict | None) -> str:
    if cell is None:
        return "-"
    return f"{cell['accuracy']:.3f}" + ("" if cell["se"] is None else f" +- {cell['se']:.3f}")


def verdict(rows: list[dict]) -> list[str]:
    """Where stale data hurt standard PPO (final accuracy more than 2 standard errors below eta 0)
    and whether the decoupled objective kept accuracy there, in numbers."""
    lines, hurt = [], []
    for row in rows:
        std = row.get("standard")
        if row["eta"] == "0" or std is None or std["vs_eta0"] is None or std["vs_eta0"]["se"] is None:
            continue
        d = std["vs_eta0"]
        if d["diff"] < -2 * d["se"]:
            hurt.append(row)
    if not any(row["eta"] != "0" and row.get("standard") for row in rows):
        return ["No standard-PPO run with stale data in this grid: no verdict on staleness."]
    if not hurt:
        return ["At no eta did standard PPO end more than 2 standard errors below eta 0: this setting has"
                " no staleness that hurts it (raise --lr or --minibatches to move versions further apart)."]
    for row in hurt:
        d = row["standard"]["vs_eta0"]
        line = f"eta {row['eta']}: standard PPO {_pm(d['diff'], d['se'])} against eta 0 (over {d['over']})"
        dec = row.get("decoupled")
        if dec and dec["vs_eta0"]:
            dd, gap = dec["vs_eta0"], row.get("decoupled_minus_standard")
            kept = dd["se"] is not None and dd["diff"] >= -2 * dd["se"]
            line += (f"; decoupled {_pm(dd['diff'], dd['se'])} against eta 0"
                     f" ({'kept within 2 standard errors' if kept else 'also lost accuracy'})")
            if gap:
                line += f", decoupled - standard {_pm(gap['diff'], gap['se'])}"
        lines.append(line)
    return lines


def report_entry(s: Settings, runs: list[dict], command: str) -> dict:
    etas = [eta_label(e) for e in s.etas]
    rows = table2(runs, etas)
    return {"key": s.key, "settings": {**dataclasses.asdict(s), "etas": etas, "config": rl_runs.CONFIG},
            "command": command, "start": start(runs), "drift_kl": drift(runs), "table2": rows, "table1": table1(runs, etas),
            "verdict": verdict(rows), "runs": runs}


def merge(existing: dict | None, entry: dict) -> dict:
    """The report file's entries with `entry` replacing the one of its setting."""
    kept = [e for e in (existing or {}).get("settings", []) if e["key"] != entry["key"]]
    return {"settings": [*kept, entry]}


def tables(entry: dict) -> str:
    paper = {eta_label(k): v for k, v in TABLE2_1P5B.items()}
    out = [f"setting {entry['key']}: KL between successive versions (eta 0, train/approx_kl)"
           f" {entry['drift_kl'] if entry['drift_kl'] is None else format(entry['drift_kl'], '.2e')};"
           f" held-out accuracy before RL {_acc(entry['start'])}", "",
           "| eta | standard PPO | decoupled | decoupled - standard | paper 1.5B standard / decoupled (%) |",
           "|---|---|---|---|---|"]
    for row in entry["table2"]:
        gap = row.get("decoupled_minus_standard")
        p = paper.get(row["eta"])
        out.append(f"| {row['eta']} | {_acc(row.get('standard'))} | {_acc(row.get('decoupled'))} |"
                   f" {_pm(gap['diff'], gap['se']) if gap else '-'} |"
                   f" {'-' if p is None else '{standard} / {decoupled}'.format(**p)} |")
    out += ["", "| eta | objective | seeds | avg@n | pass@n | vs eta 0 | mean staleness | approx KL | masked |",
            "|---|---|---|---|---|---|---|---|---|"]
    for row in entry["table2"]:
        for obj in OBJECTIVES:
            c = row.get(obj)
            if c is None or (row["eta"] == "0" and obj == "decoupled"):
                continue
            d = c["vs_eta0"] if row["eta"] != "0" else None
            out.append(f"| {row['eta']} | {'standard PPO' if obj == 'standard' else obj} | {c['seeds']} | {_acc(c)} |"
                       f" {'-' if c['pass_at_n'] is None else format(c['pass_at_n'], '.3f')} |"
                       f" {_pm(d['diff'], d['se']) if d else '-'} | {c['staleness_mean']:.2f} |"
                       f" {'-' if c['approx_kl'] is None else format(c['approx_kl'], '.2e')} | {c['masked_fraction']:.4f} |")
    t1 = entry["table1"]
    if t1:
        ratio = t1["time_to_target_ratio"]
        out += ["", f"Table 1: synchronous (eta 0) against eta {t1['best_eta']} ({t1['objective']}), same steps",
                "| run | final accuracy | training wall s | s to reach eta 0's final accuracy |", "|---|---|---|---|"]
        for name, label in (("sync", "eta 0"), ("async", f"eta {t1['best_eta']}")):
            t = t1[f"{name}_time_to_target_s"]
            out.append(f"| {label} | {_acc(t1[name])} | {t1[name]['wall_s']:.0f} | {'never' if t is None else f'{t:.0f}'} |")
        out.append(f"wall-clock ratio to reach {t1['target']:.3f}: {'-' if ratio is None else f'{ratio:.2f}'};"
                   f" for the same steps: {t1['same_steps_wall_ratio']:.2f}")
    return "\n".join(out + ["", *entry["verdict"]])


def plot(report: dict, path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    entries = report["settings"]
    fig, axes = plt.subplots(len(entries), 3, figsize=(16, 4.2 * len(entries)), squeeze=False)
    for (ax1, ax2, ax3), entry in zip(axes, entries, strict=True):
        rows = entry["table2"]
        x = list(range(len(rows)))
        for i, obj in enumerate(OBJECTIVES):
            pts = [(j, row[obj]) for j, row in enumerate(rows) if obj in row]
            if pts:
                ax1.errorbar([j + (i - 0.5) * 0.08 for j, _ in pts], [c["accuracy"] for _, c in pts],
                             yerr=[c["se"] or 0.0 for _, c in pts], marker="o", capsize=3,
                             label="standard PPO" if obj == "standard" else "decoupled PPO")
                ax3.plot([j for j, c in pts if c["approx_kl"] is not None],
                         [c["approx_kl"] for _, c in pts if c["approx_kl"] is not None], marker="o",
                         label="KL(pi_behav || pi_theta), standard" if obj == "standard"
                         else "KL(pi_prox || pi_theta), decoupled")
        if entry["start"]:
            ax1.axhline(entry["start"]["accuracy"], color="C7", ls=":", lw=1, label="before RL")
        for ax in (ax1, ax3):
            ax.set_xticks(x, [r["eta"] for r in rows])
            ax.set_xlabel("staleness bound eta")
            ax.legend(fontsize=8)
        ax1.set_ylabel("final held-out accuracy (avg@n)")
        ax1.set_title(f"Table 2 in miniature\n{entry['key']}", fontsize=9)
        ax3.set_yscale("log")  # it spans decades, and one seed's spike would flatten the rest
        ax3.set_ylabel("train/approx_kl, step mean (log)")
        ax3.set_title("how far the policy moves from its anchor", fontsize=9)
        t1 = entry["table1"]
        if t1:
            for name, label in (("sync", "eta 0 (synchronous)"), ("async", f"eta {t1['best_eta']} ({t1['objective']})")):
                c = t1[name]["curve"]
                ax2.errorbar([p["elapsed_s"] for p in c], [p["accuracy"] for p in c], yerr=[p["se"] or 0.0 for p in c],
                             marker="o", capsize=3, label=label)
            ax2.axhline(t1["target"], color="C7", ls=":", lw=1)
            ratio = t1["time_to_target_ratio"]
            ax2.set_title(f"Table 1 in miniature: time to eta 0's final accuracy,"
                          f" ratio {'-' if ratio is None else f'{ratio:.2f}'}", fontsize=9)
            ax2.legend(fontsize=8)
        ax2.set_xlabel("training wall seconds")
        ax2.set_ylabel("held-out accuracy (avg@n)")
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)


# ---- running the grid -------------------------------------------------------------------------


def reusable(run_dir: Path, wanted: list[str]) -> dict | None:
    """The result a finished run of exactly these overrides left, else None."""
    path = run_dir / RESULT_FILE
    if not path.is_file():
        return None
    saved = json.loads(path.read_text())
    return saved["result"] if saved.get("overrides") == wanted else None


def measure(s: Settings, work: Path) -> list[dict]:
    cfg = rl_runs.load_config(rl_runs.CONFIG)
    runs, todo = [], grid(s)
    for n, (index, eta, objective) in enumerate(todo, 1):
        seed_cfg = dataclasses.replace(cfg, seed=cfg.seed + index)
        model = cache_dir(seed_cfg)
        run_dir = work / s.key / run_name(seed_cfg.seed, eta, objective)
        wanted = overrides(s, model, seed_cfg.seed, eta, objective)
        result, how = reusable(run_dir, wanted), "reused"
        if result is None:
            (run_dir / RESULT_FILE).unlink(missing_ok=True)
            ensure_prepared(seed_cfg)
            records, job_s = rl_runs.run(run_dir, wanted)
            result = {**summarize_run(records, eval_accuracies(run_dir / "eval")), "job_s": job_s}
            (run_dir / RESULT_FILE).write_text(json.dumps({"overrides": wanted, "result": result}))
            how = f"{job_s:.0f} s"
        runs.append({"seed": seed_cfg.seed, "eta": eta_label(eta), "objective": objective, "run_dir": str(run_dir), **result})
        print(f"[{n}/{len(todo)}] seed {seed_cfg.seed} eta {eta_label(eta)} {objective}: held-out"
              f" {result['first']:.3f} -> {result['final']:.3f}, mean staleness {result['staleness_mean']:.2f} ({how})",
              flush=True)
    return runs


def main() -> None:
    parser = build_parser()
    args = parser.parse_args()
    cfg = rl_runs.load_config(rl_runs.CONFIG)
    try:
        settings = resolve(args, cfg.optimizer.lr, cfg.ppo.minibatches)
        check_runs(settings)
    except (argparse.ArgumentTypeError, ConfigError) as e:
        parser.error(str(e))
    command = shlex.join([".venv/bin/python", "benchmarks/staleness_quality.py", *sys.argv[1:]])
    entry = report_entry(settings, measure(settings, args.work_dir), command)
    args.out.mkdir(parents=True, exist_ok=True)
    path = args.out / f"{REPORT}.json"
    report = merge(json.loads(path.read_text()) if path.is_file() else None, entry)
    path.write_text(json.dumps(report, indent=1))
    plot(report, args.out / f"{REPORT}.png")
    print(tables(entry))
    print(f"wrote {path} and {args.out / f'{REPORT}.png'}")


if __name__ == "__main__":
    main()

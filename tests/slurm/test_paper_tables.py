"""The full-scale sweep of the paper's Tables 1 and 2 (slurm/paper_tables_sweep.sh) and its report."""

from __future__ import annotations

import json
import re
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
AREAL_HPC = str(Path(sys.executable).with_name("areal-hpc"))
REPORT = REPO / "benchmarks/paper_tables_report.py"


def sweep(tmp_path: Path, *args: str, **env: str) -> subprocess.CompletedProcess:
    env = {"PATH": "/usr/bin:/bin", "AREAL_HPC": AREAL_HPC, "AREAL_SWEEP_DIR": str(tmp_path / "sweep"), **env}
    return subprocess.run([str(REPO / "slurm/paper_tables_sweep.sh"), *args], cwd=REPO, env=env,
                          capture_output=True, text=True, timeout=600)


def baked_settings(script: Path) -> dict[str, str]:
    """The overrides baked into a rendered job script's `settings=(...)` line."""
    line = re.search(r"^settings=\((.*)\)$", script.read_text(), flags=re.M).group(1)
    return dict(re.findall(r"--set (\S+?)=(\S+)", line))


def test_table2_dry_run_renders_every_run(tmp_path: Path) -> None:
    result = sweep(tmp_path, "table2", "--dry-run", AREAL_SWEEP_STEPS="40")
    assert result.returncode == 0, result.stderr
    runs = sorted(p.parent.name for p in (tmp_path / "sweep").glob("*/run.json"))
    assert len(runs) == 13 and "eta0" in runs and "eta4-standard" in runs and "etainf-decoupled" in runs
    assert result.stderr.count("sbatch --parsable") == 26  # a training and an evaluation job each
    assert result.stderr.count("--dependency=afterok") == 0  # a dry run has no job ids to wait for
    run = json.loads((tmp_path / "sweep/eta4-standard/run.json").read_text())
    assert run == {"table": "table2", "model": "1.5b", "run": "eta4", "eta": 4, "decoupled": False,
                   "steps": 40, "job_id": None, "eval_job_id": None}
    s = baked_settings(tmp_path / "sweep/eta4-standard/job.sh")
    assert (s["rollout.eta"], s["ppo.decoupled"], s["rollout.max_new_tokens"], s["total_steps"]) == ("4", "false", "8192", "40")
    assert s["checkpoint.hf_interval"] == "40"
    assert baked_settings(tmp_path / "sweep/etainf-decoupled/job.sh")["rollout.eta"] == "40"  # unbounded
    final = tmp_path / "sweep/eta4-standard/checkpoints/step-00000040/hf"
    assert f"slurm/eval.sh {final} data/aime24.parquet {final.parent.parent.parent / 'eval'} --preset aime" in result.stderr


def test_table1_dry_run_has_sync_async_and_base(tmp_path: Path) -> None:
    result = sweep(tmp_path, "table1", "--dry-run", AREAL_BASE_MODEL="/models/base", AREAL_EVAL_DATA="a.jsonl,b.jsonl")
    assert result.returncode == 0, result.stderr
    sync = baked_settings(tmp_path / "sweep/1.5b-sync/job.sh")
    async_ = baked_settings(tmp_path / "sweep/1.5b-async/job.sh")
    assert (sync["rollout.eta"], async_["rollout.eta"]) == ("0", "8")  # math-1.5b's eta
    assert sync["total_steps"] == async_["total_steps"] == "250"
    assert json.loads((tmp_path / "sweep/1.5b-base/run.json").read_text())["run"] == "base"
    assert "slurm/eval.sh /models/base a.jsonl,b.jsonl" in result.stderr


def test_usage_and_bad_model(tmp_path: Path) -> None:
    assert sweep(tmp_path, "table3").returncode == 2
    bad = sweep(tmp_path, "table1", "--dry-run", AREAL_TABLE1_MODELS="3b")
    assert bad.returncode == 2 and "unknown model '3b'" in bad.stderr


def write_run(sweep_dir: Path, name: str, run: dict, avg: float | None, step_s: list[float] | None) -> None:
    d = sweep_dir / name
    (d / "eval").mkdir(parents=True)
    (d / "run.json").write_text(json.dumps(run))
    if avg is not None:
        summary = {"datasets": {"aime24": {"avg@n": avg, "rows": 30}, "other": {"avg@n": 0.0, "rows": 1}}}
        (d / "eval/summary.json").write_text(json.dumps(summary))
    if step_s is not None:
        lines = [json.dumps({"step": i + 1, "step_s": s}) for i, s in enumerate(step_s)]
        lines.append(json.dumps({"step": 2, "step_s": 1800.0}))  # a requeued run redid step 2: the last counts
        lines.append(json.dumps({"step": 2, "eval_accuracy": 0.1}))
        (d / "metrics.jsonl").write_text("\n".join(lines) + "\n")


def test_report_builds_both_tables(tmp_path: Path) -> None:
    s = tmp_path / "sweep"
    base = {"table": "table2", "model": "1.5b", "steps": 10}
    write_run(s, "eta0", {**base, "run": "eta0", "eta": 0, "decoupled": True}, 0.40, [3600.0, 3600.0])
    write_run(s, "eta4-standard", {**base, "run": "eta4", "eta": 4, "decoupled": False}, 0.25, None)
    write_run(s, "eta4-decoupled", {**base, "run": "eta4", "eta": 4, "decoupled": True}, 0.41, None)
    write_run(s, "etainf-standard", {**base, "run": "etainf", "eta": 10, "decoupled": False}, 0.30, None)
    t1 = {"table": "table1", "model": "1.5b", "steps": 10, "decoupled": True}
    write_run(s, "1.5b-sync", {**t1, "run": "sync", "eta": 0}, 0.42, [3600.0, 3600.0, 3600.0])
    write_run(s, "1.5b-async", {**t1, "run": "async", "eta": 8}, 0.43, [1800.0, 1800.0])
    write_run(s, "1.5b-base", {"table": "table1", "model": "1.5b", "run": "base"}, 0.29, None)
    out = tmp_path / "results"
    result = subprocess.run([sys.executable, str(REPORT), str(s), "--out", str(out)],
                            capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, result.stderr
    data = json.loads((out / "paper_tables.json").read_text())
    t2 = {r["eta"]: r for r in data["table2"]}
    assert t2[0]["standard"] == t2[0]["decoupled"] == pytest.approx(40.0)
    assert (t2[4]["standard"], t2[4]["decoupled"]) == (pytest.approx(25.0), pytest.approx(41.0))
    assert t2[None]["standard"] == pytest.approx(30.0) and t2[None]["decoupled"] is None
    assert t2[4]["paper_standard"] == 23.3
    row = data["table1"][0]
    assert (row["base"], row["sync"], row["async"]) == (pytest.approx(29.0), pytest.approx(42.0), pytest.approx(43.0))
    # sync: steps 1, 2 (redone: 1800 s), 3 -> 2.5 h; async: 0.5 + 0.5 (step 2 redone in 1800 s) -> 1 h
    assert row["sync_hours"] == pytest.approx(2.5) and row["async_hours"] == pytest.approx(1.0)
    assert row["speedup"] == pytest.approx(2.5)
    assert "| 4 | 25.0 | 41.0 | 23.3 | 42.2 |" in result.stdout
    assert "| inf | 30.0 | missing | 34.0 | 36.9 |" in result.stdout
    assert "| 1.5b | 29.0 | 42.0 | 43.0 | 29.3 | 42.0 | 42.2 | 2.5 | 1.0 | 2.50x | 2.77x |" in result.stdout
    assert (out / "paper_tables.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    named = subprocess.run([sys.executable, str(REPORT), str(s), "--out", str(out), "--dataset", "nope"],
                           capture_output=True, text=True, timeout=300)
    assert named.returncode != 0 and "no data set 'nope'" in named.stderr


def test_report_without_runs_fails(tmp_path: Path) -> None:
    result = subprocess.run([sys.executable, str(REPORT), str(tmp_path)], capture_output=True, text=True, timeout=300)
    assert result.returncode == 2 and "no run.json" in result.stderr

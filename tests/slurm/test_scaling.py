"""The strong-scaling sweep (slurm/scaling_sweep.sh) and its Figure 4 collector."""

from __future__ import annotations

import json
import re
import subprocess
import sys
from pathlib import Path

import pytest

from areal_hpc.config.load import load_config
from areal_hpc.errors import UserError
from areal_hpc.slurm.scaling import parse_context, strong_scaling_overrides

REPO = Path(__file__).resolve().parents[2]
AREAL_HPC = str(Path(sys.executable).with_name("areal-hpc"))


def sweep(tmp_path: Path, *args: str, gpus: str | None = None) -> subprocess.CompletedProcess:
    env = {"PATH": "/usr/bin:/bin", "AREAL_HPC": AREAL_HPC, "AREAL_SWEEP_DIR": str(tmp_path / "sweep"),
           **({"AREAL_SWEEP_GPUS": gpus} if gpus else {})}
    return subprocess.run([str(REPO / "slurm/scaling_sweep.sh"), *args], cwd=REPO, env=env,
                          capture_output=True, text=True, timeout=300)


def sbatch_values(script: Path, option: str) -> list[str]:
    return re.findall(rf"^#SBATCH --{option}=(\S+)$", script.read_text(), flags=re.M)


def test_context_parsing() -> None:
    assert (parse_context("16k"), parse_context("32K"), parse_context("20000")) == (16384, 32768, 20000)
    with pytest.raises(UserError, match="expected tokens"):
        parse_context("long")


def test_strong_scaling_point_keeps_the_batch_and_splits_a_quarter() -> None:
    cfg = load_config("configs/experiments/math-7b.yaml")
    overrides = strong_scaling_overrides(cfg, 128, 16384, 5, "runs/x")
    resized = load_config("configs/experiments/math-7b.yaml", overrides)
    assert (resized.cluster.train_nodes, resized.cluster.rollout_nodes) == (4, 12)
    assert (resized.trainer.tp, resized.trainer.dp, resized.generator.count) == (2, 16, 96)
    assert resized.rollout.max_prompt_len + resized.rollout.max_new_tokens == 16384
    assert resized.rollout.batch_prompts == cfg.rollout.batch_prompts
    assert (resized.total_steps, resized.logging.dir, resized.checkpoint.interval_steps) == (5, "runs/x", 0)


def test_dry_run_renders_every_point(tmp_path: Path) -> None:
    result = sweep(tmp_path, "1.5b", "16k", "--dry-run")
    assert result.returncode == 0, result.stderr
    assert result.stdout.count("sbatch --parsable") == 5
    for gpus in (32, 64, 128, 256, 512):
        point_dir = tmp_path / "sweep" / f"gpus{gpus}"
        point = json.loads((point_dir / "point.json").read_text())
        assert point == {"model": "1.5b", "context": "16k", "gpus": gpus, "steps": 20, "job_id": None}
        script = point_dir / "job.sh"
        nodes = gpus // 8
        assert sbatch_values(script, "nodes") == [str(nodes // 4), str(3 * nodes // 4)]
        assert sbatch_values(script, "ntasks") == [str(gpus // 4 + 1), str(3 * gpus // 4)]
        assert f"--set logging.dir={point_dir}" in script.read_text()


def test_impossible_point_stops_the_sweep_before_any_submission(tmp_path: Path) -> None:
    # 32 GPUs give the 32B model 8 training GPUs, fewer than its tp 8 x pp 2.
    result = sweep(tmp_path, "32b", "32k", gpus="256 32")
    assert result.returncode == 2
    assert "32 GPUs: 8 training GPUs are not a multiple of trainer.tp * trainer.pp = 16" in result.stderr
    assert "sbatch" not in result.stdout and not list((tmp_path / "sweep").glob("*/point.json"))


def test_usage_errors(tmp_path: Path) -> None:
    assert sweep(tmp_path, "3b", "16k").returncode == 2
    assert "usage:" in sweep(tmp_path, "1.5b").stderr


def write_point(sweep_dir: Path, gpus: int, per_step: list[float] | None) -> None:
    point_dir = sweep_dir / f"gpus{gpus}"
    point_dir.mkdir(parents=True)
    point = {"model": "1.5b", "context": "32k", "gpus": gpus, "steps": 4, "job_id": str(gpus)}
    (point_dir / "point.json").write_text(json.dumps(point))
    if per_step is not None:
        lines = [json.dumps({"step": i + 1, "effective_tokens_per_s": v, "reward_mean": 0.0})
                 for i, v in enumerate(per_step)]
        lines.insert(1, json.dumps({"step": 1, "eval_accuracy": 0.5}))  # a record without the field
        (point_dir / "metrics.jsonl").write_text("\n".join(lines) + "\n")


def test_report_collects_metrics_into_the_figure(tmp_path: Path) -> None:
    sweep_dir = tmp_path / "sweep"
    # The first step of each run is slow (engines starting) and is left out of the mean.
    write_point(sweep_dir, 32, [1e3, 30e3, 30e3, 30e3])
    write_point(sweep_dir, 64, [1e3, 54e3, 60e3, 66e3])
    write_point(sweep_dir, 128, [2e3, 96e3, 96e3, 96e3])
    write_point(sweep_dir, 256, None)  # still running: no metrics yet
    out = tmp_path / "results"
    result = subprocess.run([sys.executable, str(REPO / "benchmarks/scaling_report.py"), str(sweep_dir),
                             "--out", str(out)], capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, result.stderr
    rows = {r["gpus"]: r for r in json.loads((out / "scaling.json").read_text())}
    assert rows[32]["effective_tokens_per_s"] == 30e3 and rows[32]["steps_measured"] == 3
    assert rows[64]["effective_tokens_per_s"] == 60e3
    assert rows[128]["efficiency"] == pytest.approx(0.8)
    assert rows[256]["effective_tokens_per_s"] is None and rows[256]["efficiency"] is None
    assert rows[128]["paper"] == 100e3
    table = result.stdout
    assert "| 1.5b | 32k | k tokens/s | 30.0 | 60.0 | 96.0 | missing |" in table
    assert "| 1.5b | 32k | efficiency | 1.00 | 1.00 | 0.80 |  |" in table
    assert "| 1.5b | 32k | paper k tokens/s | 30 | 57 | 100 | 150 |" in table
    assert (out / "scaling.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_report_without_points_fails(tmp_path: Path) -> None:
    result = subprocess.run([sys.executable, str(REPO / "benchmarks/scaling_report.py"), str(tmp_path)],
                            capture_output=True, text=True, timeout=300)
    assert result.returncode == 2 and "no point.json" in result.stderr

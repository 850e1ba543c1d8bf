"""`areal-hpc train`: the mpiexec command it runs (one rank per place of the config's world), the
SLURM submission, and real launches through it, whose exit status it forwards."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
from job_processes import MARKER
from mpi_jobs import job_env, wait_or_explain

from areal_hpc.cli import main
from areal_hpc.config.load import load_config
from areal_hpc.runtime.train_command import exit_status, local_command, script_path

TINY = "configs/experiments/tiny-cpu.yaml"


def dry_run(capsys, *args: str) -> list[str]:
    assert main(["train", *args, "--dry-run"]) == 0
    return capsys.readouterr().out.splitlines()


def test_dry_run_prints_one_rank_per_place_of_the_world(capsys) -> None:
    (line,) = dry_run(capsys, TINY, "--set", "rollout.eta=0")
    assert line.startswith("OMP_NUM_THREADS=1 ") and f"{Path(sys.executable).with_name('mpiexec')} -n 3 " in line
    assert line.endswith(f"{sys.executable} -m areal_hpc.launch {TINY} --set rollout.eta=0")
    (line,) = dry_run(capsys, "configs/experiments/code-32b.yaml")
    assert " -n 169 " in line  # 1 controller + 96 trainers (tp8 x pp2 x dp6) + 72 generators


def test_the_world_follows_the_overrides() -> None:
    cfg = load_config(TINY, ["generator.count=3"])
    cmd = local_command(cfg, TINY, ["generator.count=3"], Path("mpiexec"), "python")
    assert cmd[:3] == ["mpiexec", "-n", "5"] and cmd[-2:] == ["--set", "generator.count=3"]


def test_dry_run_with_slurm_prints_the_render_and_the_submission(capsys) -> None:
    render, submit = dry_run(capsys, "configs/experiments/code-32b.yaml", "--slurm", "--set", "total_steps=5")
    script = script_path(load_config("configs/experiments/code-32b.yaml"))
    assert render == f"areal-hpc slurm render configs/experiments/code-32b.yaml --set total_steps=5 -o {script}"
    assert submit == f"sbatch {script}"


def test_slurm_without_sbatch_is_one_line(capsys, monkeypatch, tmp_path) -> None:
    monkeypatch.setenv("PATH", str(tmp_path))  # a PATH without sbatch
    assert main(["train", TINY, "--slurm", "--set", f"logging.dir={tmp_path}/run"]) == 2
    err = capsys.readouterr().err.splitlines()
    assert err[-1] == "error: --slurm: sbatch not found on PATH: submit from a SLURM login node, or train here without --slurm"
    assert all(line.startswith("verify: ") for line in err[:-1])  # the layout verified first
    assert not (tmp_path / "run").exists()


def test_slurm_refuses_a_layout_that_does_not_verify(capsys, monkeypatch, tmp_path) -> None:
    monkeypatch.setenv("PATH", str(tmp_path))
    assert main(["train", TINY, "--slurm", "--set", f"logging.dir={tmp_path}/run", "--set",
                 "generator.kv_cache_bytes=1048576"]) == 2
    err = capsys.readouterr().err
    assert "error: --slurm: the layout does not verify (areal-hpc slurm verify):\n  generator KV cache: 512 tokens" in err
    assert not (tmp_path / "run").exists()


def test_a_bad_config_exits_2_with_the_config_error(capsys) -> None:
    assert main(["train", TINY, "--set", "trainer.tpp=2", "--dry-run"]) == 2
    assert capsys.readouterr().err == "error: unknown key 'trainer.tpp'; did you mean 'trainer.tp'? (from --set)\n"
    assert main(["train", "no/such.yaml"]) == 2
    assert "config file not found" in capsys.readouterr().err


def test_exit_status_of_a_signalled_job() -> None:
    assert (exit_status(0), exit_status(2), exit_status(-9)) == (0, 2, 137)


def train(overrides: list[str], timeout: float) -> tuple[int, str]:
    env = job_env()
    cmd = [sys.executable, "-m", "areal_hpc.cli", "train", TINY, *[a for o in overrides for a in ("--set", o)]]
    proc = subprocess.Popen(cmd, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    out, err = wait_or_explain(proc, env[MARKER], timeout)
    return proc.returncode, out + err


def test_a_launch_refused_on_rank_0_exits_2_through_mpiexec(tmp_path) -> None:
    """The data file is read by rank 0 of the MPI world train starts, not by train itself."""
    data = tmp_path / "train.jsonl"
    data.write_text('{"prompt": "1+1?", "answer": "2"}\n{"prompt": "2+2?" "answer": "4"}\n')
    code, output = train([f"data.train_path={data}", f"logging.dir={tmp_path}/run"], timeout=120)
    assert code == 2, output
    assert "line 2: not valid JSON" in output and "does not match" not in output, output


@pytest.mark.slow
def test_one_step_of_the_tiny_config(tmp_path, tiny_model_dir) -> None:
    run_dir = tmp_path / "run"
    code, output = train([f"model.path={tiny_model_dir}", f"logging.dir={run_dir}", "total_steps=1",
                          "rollout.batch_prompts=4", "rollout.group_size=4", "rollout.max_new_tokens=32",
                          "data.synthetic_eval_size=8", "eval_interval=0", "checkpoint.interval_steps=0",
                          "checkpoint.resume=never", "logging.tensorboard=false"], timeout=600)
    assert code == 0, output[-5000:]
    records = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in records if "trained_tokens" in r] == [1]

"""slurm/eval.sh: syntax, usage and the commands it runs (printed by AREAL_DRY_RUN=1)."""

from __future__ import annotations

import os
import shlex
import subprocess
from pathlib import Path

SCRIPT = str(Path(__file__).resolve().parents[2] / "slurm" / "eval.sh")


def dry_run(*args: str, nodes: int) -> list[list[str]]:
    env = dict(os.environ, AREAL_DRY_RUN="1", SLURM_JOB_NUM_NODES=str(nodes), AREAL_PYTHON="echo")
    result = subprocess.run(["bash", SCRIPT, *args], capture_output=True, text=True, env=env, check=True)
    return [shlex.split(line) for line in result.stdout.splitlines()]


def test_syntax():
    result = subprocess.run(["bash", "-n", SCRIPT], capture_output=True, text=True)
    assert result.returncode == 0, result.stderr


def test_too_few_arguments_print_usage_and_exit_2():
    for args in ([], ["model"], ["model", "data.jsonl"], ["", "data.jsonl", "out"]):
        result = subprocess.run(["bash", SCRIPT, *args], capture_output=True, text=True,
                                env=dict(os.environ, AREAL_DRY_RUN="1"))
        assert result.returncode == 2 and "usage:" in result.stderr, args


def test_one_node_runs_one_shard_and_no_merge():
    (step,) = dry_run("/ckpt/a b", "x.jsonl,y.jsonl", "out dir", "--preset", "aime", nodes=1)
    assert step[:5] == ["srun", "--nodes=1", "--ntasks=1", "--ntasks-per-node=1", "--kill-on-bad-exit=1"]
    program = step[step.index("bash") + 4:]  # after bash -c SCRIPT bash
    assert program == ["echo", "-m", "areal_hpc.cli", "eval", "--model", "/ckpt/a b", "--data", "x.jsonl,y.jsonl",
                       "--out", "out dir", "--set", "generator.dtype=bf16", "--preset", "aime"]


def test_each_task_evaluates_its_shard_and_the_shards_are_merged():
    step, merge = dry_run("m", "d.jsonl", "out", "--set", "generator.dtype=fp16", nodes=3)
    assert "--nodes=3" in step and "--ntasks=3" in step
    assert merge == ["echo", "-m", "areal_hpc.cli", "eval-merge", "--out", "out"]
    # What srun starts on the node with SLURM_PROCID 2: the eval command with its shard appended.
    task = step[step.index("bash"):]
    env = dict(os.environ, SLURM_PROCID="2", SLURM_NTASKS="3")
    out = subprocess.run(task, capture_output=True, text=True, env=env, check=True).stdout.split()
    assert out[-4:] == ["--set", "generator.dtype=fp16", "--shard", "2/3"]

"""The sbatch template under a real SLURM: one MPI world across both het components, every rank
where the plan puts it, the settings the scripts promise (partitions, config, program)."""

from __future__ import annotations

from pathlib import Path

import pytest
from slurm_jobs import PROBE_ENV, REPO, TINY, Cluster, probe_runs, write_script

pytestmark = pytest.mark.slurm


def test_tiny_config_runs_as_one_world_across_partitions(slurm_cluster: Cluster, tmp_path: Path) -> None:
    run_dir = tmp_path / "run"
    script = write_script(tmp_path, TINY, [f"logging.dir={run_dir}", "total_steps=3"])
    output = tmp_path / "job.out"
    job = slurm_cluster.sbatch(script, output=output, env={**PROBE_ENV})
    comps = slurm_cluster.wait(job)
    assert [c["JobState"] for c in comps] == ["COMPLETED", "COMPLETED"], slurm_cluster.explain(output)
    assert [c["Partition"] for c in comps] == ["train", "rollout"]
    (run,) = probe_runs(run_dir)
    assert run["problems"] == [] and run["world_size"] == 3
    assert [(r["rank"], r["component"]) for r in run["ranks"]] == [(0, 0), (1, 0), (2, 1)]
    # Each component on its own node, as SLURM allocated them.
    assert [r["nodename"] for r in run["ranks"]] == [comps[0]["NodeList"]] * 2 + [comps[1]["NodeList"]]
    assert (run["start_step"], run["end_step"], run["stopped"]) == (0, 3, "completed")


def test_gpu_layout_matches_the_plan(slurm_cluster: Cluster, tmp_path: Path) -> None:
    """The 1.5B script's shape at 4 GPUs per node: 2 + 2 exclusive nodes, 5 + 4 tasks in component
    0 (controller beside the first node's trainers), 2 engines of 2 GPUs per rollout node."""
    nodes = slurm_cluster.run("sinfo", "-h", "-N", "-p", "train", "-o", "%N %G").stdout.split("\n")
    if len({line.split()[0] for line in nodes if line}) < 4 or "gpu:4" not in nodes[0]:
        pytest.skip("needs the local cluster's default shape: 4 nodes with 4 simulated GPUs each")
    run_dir = tmp_path / "run"
    overrides = ["cluster.gpus_per_node=4", "cluster.train_nodes=2", "cluster.rollout_nodes=2", "trainer.dp=8",
                 "generator.count=4", "generator.tensor_parallel_size=2", "total_steps=1", f"logging.dir={run_dir}"]
    script = write_script(tmp_path, "configs/experiments/math-1.5b.yaml", overrides)
    output = tmp_path / "job.out"
    job = slurm_cluster.sbatch(script, output=output, env={**PROBE_ENV, "AREAL_MPI": "pmi2"})
    comps = slurm_cluster.wait(job)
    assert [c["JobState"] for c in comps] == ["COMPLETED", "COMPLETED"], slurm_cluster.explain(output)
    (run,) = probe_runs(run_dir)
    assert run["problems"] == [] and run["world_size"] == 13
    per_node: dict[tuple[int, int], int] = {}
    for r in run["ranks"]:
        per_node[(r["component"], r["node"])] = per_node.get((r["component"], r["node"]), 0) + 1
    assert per_node == {(0, 0): 5, (0, 1): 4, (1, 0): 2, (1, 1): 2}
    assert len({r["nodename"] for r in run["ranks"]}) == 4


def test_direct_run_submits_itself_with_partitions_config_and_python_from_env(
        slurm_cluster: Cluster, tmp_path: Path) -> None:
    """`AREAL_TRAIN_PARTITION=.. slurm/train_*.sh` (not through sbatch), from another directory."""
    run_dir = tmp_path / "run"
    # The script's own config path does not exist from there: AREAL_CONFIG must replace it.
    script = write_script(tmp_path, TINY, [], named="no/such/config.yaml")
    env = {**slurm_cluster.env, "AREAL_TRAIN_PARTITION": "rollout", "AREAL_ROLLOUT_PARTITION": "train",
           "AREAL_CONFIG": str(REPO / TINY), "AREAL_PYTHON": str(REPO / ".venv/bin/python"),
           **PROBE_ENV}
    # The script checks the layout (`slurm verify`, ~15 s of imports here) before it submits itself.
    submitted = slurm_cluster.run(str(script), "--set", f"logging.dir={run_dir}", "--set", "total_steps=1",
                                  env=env, cwd=tmp_path, timeout=300).stdout
    job = submitted.split()[-1]
    comps = slurm_cluster.wait(job)
    output = tmp_path / f"tiny-cpu-{job}.out"
    assert [c["JobState"] for c in comps] == ["COMPLETED", "COMPLETED"], slurm_cluster.explain(output)
    assert [c["Partition"] for c in comps] == ["rollout", "train"]
    assert probe_runs(run_dir)[0]["problems"] == []


def test_world_that_does_not_match_the_config_fails(slurm_cluster: Cluster, tmp_path: Path) -> None:
    run_dir = tmp_path / "run"
    script = write_script(tmp_path, TINY, [f"logging.dir={run_dir}"])
    output = tmp_path / "job.out"
    # Arguments after the script reach the program: the config now wants 2 generators, SLURM runs 1.
    job = slurm_cluster.sbatch(script, "--set", "generator.count=2", output=output,
                               env={**PROBE_ENV})
    comps = slurm_cluster.wait(job)
    assert comps[0]["JobState"] == "FAILED", slurm_cluster.explain(output)
    text = output.read_text()
    refused = text.index("MPI world size 3 does not match the config")
    # A refused launch (exit 2) is not requeued: it would fail the same way again. (A run before it
    # may have hung in MPI_Init and been requeued as a crash: see PROBE_ENV.)
    assert probe_runs(run_dir)[-1]["problems"]
    assert "requeueing" not in text[refused:]


def test_a_job_that_outlives_its_wait_is_stopped_with_its_stacks(slurm_cluster: Cluster, tmp_path: Path) -> None:
    """The harness itself: a hung job must not hold the nodes that later tests' jobs wait for,
    and the failure must show where its ranks waited."""
    run_dir = tmp_path / "run"
    script = write_script(tmp_path, TINY, [f"logging.dir={run_dir}", "total_steps=1"])
    job = slurm_cluster.sbatch(script, output=tmp_path / "job.out",
                               env={**PROBE_ENV, "AREAL_PROBE_STEP_S": "600"})
    with pytest.raises(AssertionError) as failed:
        slurm_cluster.wait(job, timeout=8)
    assert "stopped job" in str(failed.value) and "thread 0x" in str(failed.value), str(failed.value)
    assert "in run" in str(failed.value)  # the probe's step loop, where its ranks slept
    assert {c["JobState"] for c in slurm_cluster.components(job)} <= {"CANCELLED", "FAILED"}
    assert job not in slurm_cluster.unfinished_jobs()

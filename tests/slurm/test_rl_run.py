"""The tiny asynchronous RL run, every component real, launched by the sbatch template under the
local SLURM with the script's own program (the launcher): controller and Megatron trainer in
component 0 (partition train), the vLLM generator in component 1 (partition rollout), one MPI
world. Mid-run the time-limit signal stops it; the job is requeued, resumes from the checkpoint
and completes, and the metrics show every step once. In another run, with two generators, one is
killed with SIGKILL and the run goes on with the other; when that one is killed too, rank 0
checkpoints and stops for a requeue, nothing of the job is left running, and the requeued job
resumes; its trainer killed, it is requeued again and completes."""

from __future__ import annotations

import json
import os
import re
import signal
import time
import uuid
from pathlib import Path

import pytest
from job_processes import MARKER, describe, job_groups, rank_pid, snapshot, survivors
from slurm_jobs import TINY, Cluster, write_script
from warm_model import warm_model_dir

from areal_hpc.metrics.jsonl import read_records
from areal_hpc.metrics.writer import METRICS_FILE

pytestmark = [pytest.mark.slurm, pytest.mark.slow]
ETA, STEPS, STOP_AFTER = 2, 6, 2


def trained_steps(run_dir: Path) -> list[dict]:
    return [r for r in read_records(run_dir / METRICS_FILE) if "trained_tokens" in r]


def submit_run(cluster: Cluster, tmp: Path, *settings: str, **env: str) -> tuple[str, Path, Path]:
    """The tiny run through the rendered script with the script's default program (the launcher)."""
    model = warm_model_dir()
    run_dir = tmp / "run"
    overrides = [
        f"logging.dir={run_dir}", f"model.path={model}", f"total_steps={STEPS}", f"rollout.eta={ETA}",
        "rollout.staleness_gate=strict", "rollout.batch_prompts=4", "rollout.group_size=4", "rollout.max_concurrent=8",
        "rollout.max_new_tokens=128", "data.synthetic_eval_size=16", "checkpoint.interval_steps=2",
        "logging.tensorboard=false", *settings,
    ]
    output = tmp / "job.out"
    job = cluster.sbatch(write_script(tmp, TINY, overrides), output=output,
                         env={"VLLM_LOGGING_LEVEL": "WARNING", "AREAL_STOP_GRACE_S": "120", **env})
    return job, run_dir, output


def wait_for_steps(cluster: Cluster, job: str, run_dir: Path, output: Path, steps: int) -> None:
    deadline = time.monotonic() + 900
    while len(trained_steps(run_dir)) < steps:
        states = [c["JobState"] for c in cluster.components(job)]
        assert time.monotonic() < deadline and set(states) <= {"PENDING", "RUNNING"}, cluster.explain(output)
        time.sleep(1)


@pytest.fixture(scope="module")
def requeued_run(slurm_cluster: Cluster, tmp_path_factory: pytest.TempPathFactory) -> dict:
    job, run_dir, output = submit_run(slurm_cluster, tmp_path_factory.mktemp("rl-run"))
    wait_for_steps(slurm_cluster, job, run_dir, output, STOP_AFTER)
    slurm_cluster.run("scancel", "--batch", "--signal=USR1", job)
    comps = slurm_cluster.wait(job, timeout=1200)
    return {"job": job, "comps": comps, "run_dir": run_dir, "output": output, "log": output.read_text(),
            "explain": slurm_cluster.explain(output)}


def test_completes_across_both_partitions(requeued_run: dict) -> None:
    comps = requeued_run["comps"]
    assert [c["JobState"] for c in comps] == ["COMPLETED", "COMPLETED"], requeued_run["explain"]
    assert [c["Partition"] for c in comps] == ["train", "rollout"]
    assert comps[0]["NodeList"] != comps[1]["NodeList"]
    log = requeued_run["log"]
    assert "-m areal_hpc.launch" in log and "[rank 1 trainer 0]" in log and "[rank 2 generator 0]" in log


def test_stops_on_the_signal_and_resumes_after_the_requeue(requeued_run: dict) -> None:
    log, job = requeued_run["log"], requeued_run["job"]
    assert requeued_run["comps"][0]["Restarts"] == "1", requeued_run["explain"]
    assert "stopped on request at version" in log and "has not ended" not in log, requeued_run["explain"]
    assert f"before the time limit (exit 0): requeueing job {job}" in log
    stopped_at = int(log.split("stopped on request at version ")[1].split(";")[0])
    assert STOP_AFTER <= stopped_at < STEPS
    assert f"resumed from version {stopped_at}" in log


def test_metrics_have_every_step_once(requeued_run: dict) -> None:
    steps = trained_steps(requeued_run["run_dir"])
    assert [r["step"] for r in steps] == list(range(1, STEPS + 1)), requeued_run["explain"]
    assert all(r["effective_tokens_per_s"] > 0 and r["staleness_max"] <= ETA for r in steps)
    assert json.loads((requeued_run["run_dir"] / "summary.json").read_text())


@pytest.mark.faults
def test_generators_lost_are_survived_then_requeued_and_a_killed_trainer_requeues(
        slurm_cluster: Cluster, tmp_path: Path) -> None:
    """Two generators, each on a node of its own. kill -9 of generator 1: srun leaves the others
    running (--kill-on-bad-exit=0), rank 0 names it from its lifeline and the run goes on with
    generator 0 alone. kill -9 of generator 0 then leaves fewer than rollout.min_generators:
    rank 0 checkpoints at the step boundary and exits 3, nothing of that run is left running, and
    the batch script requeues it; the requeued run resumes from that version with both generators.
    kill -9 of the trainer there: rank 0 names it and ends the run, which is requeued again and
    completes from its last checkpoint, every step and every prompt trained once."""
    marker, steps_total = uuid.uuid4().hex, 10
    job, run_dir, output = submit_run(slurm_cluster, tmp_path, "generator.count=2", "cluster.rollout_nodes=2",
                                      f"total_steps={steps_total}", **{MARKER: marker})
    wait_for_steps(slurm_cluster, job, run_dir, output, 1)
    groups = job_groups(marker)
    os.kill(rank_pid(3, marker), signal.SIGKILL)
    deadline = time.monotonic() + 120
    while not [r for r in trained_steps(run_dir) if r["generators_alive"] == 1] and time.monotonic() < deadline:
        time.sleep(0.5)
    log = output.read_text()
    assert "rank 3 (generator 1) died without reporting an error" in log, slurm_cluster.explain(output)
    assert "1 of 2 generators left" in log and "requeueing job" not in log, slurm_cluster.explain(output)
    # The requeued run (cred_expire 10 s here) carries the same marker: check the processes of this one.
    before = snapshot(marker, groups)
    os.kill(rank_pid(2, marker), signal.SIGKILL)
    deadline = time.monotonic() + 120
    while "requeueing job" not in output.read_text() and time.monotonic() < deadline:
        time.sleep(0.5)
    assert "rank 2 (generator 0) died without reporting an error" in output.read_text(), \
        slurm_cluster.explain(output)
    deadline = time.monotonic() + 30
    while survivors(before) and time.monotonic() < deadline:
        time.sleep(0.5)
    left = survivors(before)
    assert not left, f"processes of the failed run were left running: {describe(left)}"
    stopped = re.search(r"stopped at version (\d+) with 0 generator\(s\) left", output.read_text())
    assert stopped, slurm_cluster.explain(output)
    # The requeued run trains a step past the version it resumed from; then its trainer dies.
    deadline = time.monotonic() + 300
    while (f"resumed from version {stopped[1]} " not in output.read_text()
           or max((r["step"] for r in trained_steps(run_dir)), default=0) <= int(stopped[1])):
        assert time.monotonic() < deadline, slurm_cluster.explain(output)
        time.sleep(0.5)
    os.kill(rank_pid(1, marker), signal.SIGKILL)
    comps = slurm_cluster.wait(job, timeout=600)
    assert [c["JobState"] for c in comps] == ["COMPLETED", "COMPLETED"], slurm_cluster.explain(output)
    assert comps[0]["Restarts"] == "2", slurm_cluster.explain(output)
    log = output.read_text()
    assert "rank 1 (trainer 0) died without reporting an error" in log, slurm_cluster.explain(output)
    assert "rank 0 (controller) failed" not in log, slurm_cluster.explain(output)  # its abort ends it
    for restart in (1, 2):
        assert re.search(rf"the run failed \(exit \d+\): requeueing job {job} \(crash restart {restart} of 3\)", log)
    steps = trained_steps(run_dir)
    assert [r["step"] for r in steps] == list(range(1, steps_total + 1))
    # 2 generators, 1 after the first loss, 2 again in the requeued runs.
    alive = [r["generators_alive"] for r in steps]
    assert alive[0] == 2 and 1 in alive and alive[-1] == 2, alive
    ids = [pid for e in read_records(run_dir / "ledger.jsonl") for pid in e["prompt_ids"]]
    assert len(ids) == len(set(ids)), "a prompt was trained twice"


@pytest.mark.faults
def test_a_warm_spare_of_the_script_takes_a_lost_generators_place(slurm_cluster: Cluster, tmp_path: Path) -> None:
    """cluster.spare_nodes=1: the script starts a spare generator on a third component, outside the
    MPI world; it waits for this run's rank 0 and loads its engine. kill -9 of generator 1 then:
    the spare takes rank 3, joins the next weight update and generates. SIGTERM to rank 0 stops the
    run (a checkpoint, exit 0: no requeue), the spare leaves with it, and every component completes
    with every step and every prompt trained once."""
    marker = uuid.uuid4().hex
    job, run_dir, output = submit_run(slurm_cluster, tmp_path, "generator.count=2", "cluster.spare_nodes=1",
                                      "total_steps=1000", **{MARKER: marker})
    deadline = time.monotonic() + 900  # beside the running job on 2 cores a spare's engine takes minutes
    while not output.is_file() or "spare ready" not in output.read_text() or not trained_steps(run_dir):
        states = [c["JobState"] for c in slurm_cluster.components(job)]
        assert time.monotonic() < deadline and set(states) <= {"PENDING", "RUNNING"}, slurm_cluster.explain(output)
        time.sleep(1)
    os.kill(rank_pid(3, marker), signal.SIGKILL)
    deadline = time.monotonic() + 300
    while "rank 3 (generator 1) (a replacement) sent its first trajectory" not in output.read_text():
        assert time.monotonic() < deadline, slurm_cluster.explain(output)
        time.sleep(0.5)
    first_at = trained_steps(run_dir)[-1]["step"]
    while trained_steps(run_dir)[-1]["step"] < first_at + 2:
        assert time.monotonic() < deadline, slurm_cluster.explain(output)
        time.sleep(0.5)
    os.kill(rank_pid(0, marker), signal.SIGTERM)
    comps = slurm_cluster.wait(job, timeout=600)
    log = output.read_text()
    assert [c["JobState"] for c in comps] == ["COMPLETED"] * 3, slurm_cluster.explain(output)
    assert comps[0]["Restarts"] == "0" and "requeueing job" not in log, slurm_cluster.explain(output)
    assert "[spare]" in log and "a replacement takes the place of rank 3 (generator 1)" in log, log[-5000:]
    assert "[rank 3 generator 1]" in log and "stopped on request" in log, log[-5000:]
    samples = re.search(r"rank 3 \(replacement\): (\d+)", log)
    assert samples and int(samples[1]) > 0, log[-5000:]
    steps = trained_steps(run_dir)
    assert [r["step"] for r in steps] == list(range(1, len(steps) + 1))
    assert steps[-1]["generators_alive"] == 2
    ids = [pid for e in read_records(run_dir / "ledger.jsonl") for pid in e["prompt_ids"]]
    assert len(ids) == len(set(ids)), "a prompt was trained twice"
    assert not (run_dir / "join.json").exists()

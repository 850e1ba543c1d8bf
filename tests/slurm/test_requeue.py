"""Resilience under a real SLURM: the run is stopped mid-way, SLURM requeues the job, and the run
resumes from its checkpoint and completes.

Two ways to stop it: the signal SLURM sends to the batch shell before the time limit (delivered
here with `scancel --batch --signal=USR1`, the path `--signal=B:USR1@300` takes), and a node
failure. Measured with SLURM 22.05: losing a node of component 1 requeues the whole het job;
losing the batch node (component 0's first) requeues component 0 only and the job then stays
pending, so that case is not tested here. The probe stands in for the controller: it checkpoints
its step count after every step and resumes from it, as checkpoint.resume=auto does.
"""

from __future__ import annotations

import json
import re
import subprocess
import time
from pathlib import Path

import pytest
from slurm_jobs import PROGRAM, TINY, Cluster, probe_runs, write_script

pytestmark = [pytest.mark.slurm, pytest.mark.slow, pytest.mark.faults]
STEPS = 10


def start_job(cluster: Cluster, tmp_path: Path, steps: int = STEPS, options: tuple[str, ...] = (),
              **env: str) -> tuple[str, Path, Path]:
    run_dir = tmp_path / "run"
    script = write_script(tmp_path, TINY, [f"logging.dir={run_dir}", f"total_steps={steps}"])
    output = tmp_path / "job.out"
    job = cluster.sbatch(script, output=output, options=options,
                         env={"AREAL_PROGRAM": PROGRAM, "AREAL_PROBE_STEP_S": "1", **env})
    return job, run_dir, output


def wait_for_step(cluster: Cluster, run_dir: Path, output: Path, step: int, timeout: float = 120) -> None:
    checkpoint = run_dir / "probe-checkpoint.json"
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if checkpoint.is_file() and json.loads(checkpoint.read_text())["step"] >= step:
            return
        time.sleep(0.2)
    raise AssertionError(f"no checkpoint of step {step} after {timeout} s\n{cluster.explain(output)}")


def test_time_limit_signal_stops_requeues_and_resumes(slurm_cluster: Cluster, tmp_path: Path) -> None:
    """Twice: the second stop also finds the controller in the requeued run."""
    job, run_dir, output = start_job(slurm_cluster, tmp_path)
    for stops, stop_after in enumerate((2, 5), start=1):
        wait_for_step(slurm_cluster, run_dir, output, stop_after)
        slurm_cluster.run("scancel", "--batch", "--signal=USR1", job)
        deadline = time.monotonic() + 60
        while len(probe_runs(run_dir)) < stops and time.monotonic() < deadline:  # the run has stopped
            time.sleep(0.2)
    comps = slurm_cluster.wait(job)
    assert [c["JobState"] for c in comps] == ["COMPLETED", "COMPLETED"], slurm_cluster.explain(output)
    assert comps[0]["Restarts"] == "2"
    runs = probe_runs(run_dir)
    assert [(r["restart"], r["stopped"]) for r in runs] == [
        (0, "stop-request"), (1, "stop-request"), (2, "completed")]
    assert runs[0]["start_step"] == 0 and 2 <= runs[0]["end_step"] < 5 <= runs[1]["end_step"] < STEPS
    assert runs[1]["start_step"] == runs[0]["end_step"] and runs[2]["start_step"] == runs[1]["end_step"]
    assert runs[2]["end_step"] == STEPS
    assert output.read_text().count(f"before the time limit (exit 0): requeueing job {job}") == 2


def test_run_that_does_not_end_is_requeued_after_the_grace(slurm_cluster: Cluster, tmp_path: Path) -> None:
    """A shutdown stuck in teardown must not run into the time limit."""
    # Steps of 10 s: the probe acts on the stop at the end of its step, long after the 2 s grace.
    job, run_dir, output = start_job(slurm_cluster, tmp_path, steps=2, AREAL_PROBE_STEP_S="10",
                                     AREAL_STOP_GRACE_S="2")
    wait_for_step(slurm_cluster, run_dir, output, 1)
    slurm_cluster.run("scancel", "--batch", "--signal=USR1", job)
    comps = slurm_cluster.wait(job)
    assert [c["JobState"] for c in comps] == ["COMPLETED", "COMPLETED"], slurm_cluster.explain(output)
    assert comps[0]["Restarts"] == "1"
    # The requeue ended the first run inside its second step, before it wrote its record.
    (resumed,) = probe_runs(run_dir)
    assert (resumed["restart"], resumed["start_step"], resumed["stopped"]) == (1, 1, "completed")
    assert "the run has not ended 2 s after the stop request" in output.read_text()


def test_node_failure_requeues_and_resumes(slurm_cluster: Cluster, tmp_path: Path) -> None:
    job, run_dir, output = start_job(slurm_cluster, tmp_path)
    wait_for_step(slurm_cluster, run_dir, output, 2)
    node = slurm_cluster.components(job)[1]["NodeList"]
    slurm_cluster.run("scontrol", "update", f"nodename={node}", "state=down", "reason=areal-hpc-test")
    try:
        comps = slurm_cluster.wait(job)
    finally:  # the node normally returns by itself (ReturnToService=2)
        state = slurm_cluster.run("sinfo", "-h", "-n", node, "-o", "%T").stdout
        if "down" in state or "drain" in state:
            slurm_cluster.run("scontrol", "update", f"nodename={node}", "state=resume")
    assert [c["JobState"] for c in comps] == ["COMPLETED", "COMPLETED"], slurm_cluster.explain(output)
    assert comps[0]["Restarts"] == "1"
    # The killed run left no record; the requeued run resumed from its last checkpoint.
    (resumed,) = probe_runs(run_dir)
    assert resumed["restart"] == 1 and resumed["start_step"] >= 2
    assert (resumed["end_step"], resumed["stopped"]) == (STEPS, "completed")
    assert "NODE FAILURE" in output.read_text()


def mpich_segments(job: str, step: int) -> str:
    """The glob of MPICH's node shared memory for a job step under pmi2: mpich_shm_<H>_<node>,
    H the 32-bit FNV-1a hash of "JOB.STEP" (MPICH's MPIR_Process.world_id)."""
    h = 2166136261
    for byte in f"{job}.{step}".encode():
        h = (h ^ byte) * 16777619 & 0xFFFFFFFF
    return f"mpich_shm_{h:x}_*"


def test_stale_mpi_shared_memory_of_the_job_is_removed_before_launch(
        slurm_cluster: Cluster, tmp_path: Path) -> None:
    """A rank killed by a signal leaves its node's MPICH segments behind, and a requeued job has the
    same job and step ids: its ranks would attach to them. Empty segments stand in for a dead run's
    (attaching to one waits forever for its size); the script must remove them first."""
    job, run_dir, output = start_job(slurm_cluster, tmp_path, steps=4, options=("--hold",))
    shm = Path("/dev/shm")
    planted = [shm / mpich_segments(job, 1).replace("*", str(node)) for node in (0, 1)]
    try:
        for path in planted:
            path.touch()
        slurm_cluster.run("scontrol", "release", job)
        wait_for_step(slurm_cluster, run_dir, output, 1, timeout=60)
        # The naming rule is MPICH's own: the running program's segments are the ones it names.
        live = sorted(shm.glob(mpich_segments(job, 1)))
        assert [p.name for p in live] == [p.name for p in planted] and all(p.stat().st_size for p in live)
        comps = slurm_cluster.wait(job)
    finally:  # nothing of the job left running, nothing planted left behind
        subprocess.run(["scancel", job], env=slurm_cluster.env, capture_output=True, check=False)
        for path in planted:
            path.unlink(missing_ok=True)
    assert [c["JobState"] for c in comps] == ["COMPLETED", "COMPLETED"], slurm_cluster.explain(output)
    assert [r["stopped"] for r in probe_runs(run_dir)] == ["completed"]


def test_a_crash_is_requeued_and_resumes(slurm_cluster: Cluster, tmp_path: Path) -> None:
    """A run that fails (here rank 0 aborts at step 3, as when a trainer dies) is requeued by the
    batch script, counted in the job's comment, and the next run resumes from the checkpoint."""
    job, run_dir, output = start_job(slurm_cluster, tmp_path, steps=6, AREAL_PROBE_CRASH_AT="3")
    comps = slurm_cluster.wait(job)
    assert [c["JobState"] for c in comps] == ["COMPLETED", "COMPLETED"], slurm_cluster.explain(output)
    assert comps[0]["Restarts"] == "1"
    (resumed,) = probe_runs(run_dir)  # the crashed run wrote no record
    assert (resumed["restart"], resumed["start_step"], resumed["end_step"]) == (1, 3, 6)
    log = output.read_text()
    assert "probe: crashing at step 3" in log
    # srun reports the aborted tasks' status (137: killed), whatever code MPI_Abort was given.
    assert re.search(rf"the run failed \(exit \d+\): requeueing job {job} \(crash restart 1 of 3\)", log), log[-3000:]


def test_crash_restarts_are_bounded(slurm_cluster: Cluster, tmp_path: Path) -> None:
    job, _, output = start_job(slurm_cluster, tmp_path, steps=6, AREAL_PROBE_CRASH_AT="2", AREAL_MAX_RESTARTS="0")
    comps = slurm_cluster.wait(job)
    assert comps[0]["JobState"] == "FAILED" and comps[0]["Restarts"] == "0", slurm_cluster.explain(output)
    assert re.search(r"the run failed \(exit \d+\) after 0 crash restarts \(AREAL_MAX_RESTARTS = 0\): not requeued",
                     output.read_text())

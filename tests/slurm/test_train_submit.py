"""`areal-hpc train CONFIG --slurm` under a real SLURM: the layout verified, the script written into
logging.dir and submitted with sbatch, one MPI world of the config's ranks across both components."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
from slurm_jobs import PROBE_ENV, REPO, TINY, Cluster, probe_runs

pytestmark = pytest.mark.slurm


def test_train_submits_the_rendered_script(slurm_cluster: Cluster, tmp_path: Path) -> None:
    run_dir = tmp_path / "run"
    # From another directory (where the job's output lands), the config named by its full path.
    env = {**slurm_cluster.env, "AREAL_PYTHON": sys.executable, **PROBE_ENV}
    done = subprocess.run([sys.executable, "-m", "areal_hpc.cli", "train", str(REPO / TINY), "--slurm",
                           "--set", f"logging.dir={run_dir}", "--set", "total_steps=1"],
                          env=env, cwd=tmp_path, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr
    assert done.stdout.startswith(f"wrote {run_dir}/sbatch.sh\nSubmitted batch job "), done.stdout
    job = done.stdout.split()[-1]
    comps = slurm_cluster.wait(job)
    assert [c["JobState"] for c in comps] == ["COMPLETED", "COMPLETED"], \
        slurm_cluster.explain(tmp_path / f"tiny-cpu-{job}.out")
    (run,) = probe_runs(run_dir)
    assert run["problems"] == [] and run["world_size"] == 3

"""cluster.network_interface in a real MPI job: a missing interface refuses the launch in seconds,
and a named one carries the whole run (lifelines, trainer group, weight group)."""

from __future__ import annotations

import pytest
from mpi_jobs import run_job


def test_a_missing_interface_refuses_the_launch():
    job = run_job(3, ["cluster.network_interface=no-such-if0"], timeout=120)
    assert job.returncode == 2, job.output
    assert "error: cluster.network_interface = 'no-such-if0': no such interface with an IPv4 address" in job.output
    assert "Traceback" not in job.output and "EngineCore" not in job.output, job.output
    assert job.seconds < 60


@pytest.mark.slow
def test_a_run_over_a_named_interface(tmp_path, tiny_model_dir):
    """Every listener of the job binds the named interface's address; the run completes."""
    from areal_hpc.wire.network import ipv4_addresses

    found = ipv4_addresses()
    name = next((n for n, a in sorted(found.items()) if not a.startswith("127.")), "lo")
    job = run_job(3, [f"cluster.network_interface={name}", f"logging.dir={tmp_path}", f"model.path={tiny_model_dir}",
                      "total_steps=1", "rollout.batch_prompts=2", "rollout.group_size=2", "rollout.max_new_tokens=32",
                      "data.synthetic_eval_size=4", "checkpoint.interval_steps=0", "logging.tensorboard=false"],
                  timeout=600)
    assert job.returncode == 0, job.output[-5000:]
    assert '"train/skipped_steps": 0.0' in (tmp_path / "metrics.jsonl").read_text()

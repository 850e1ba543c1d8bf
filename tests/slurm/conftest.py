"""Fixtures of the SLURM tests: a real local cluster (slurm/local/) and shellcheck.

The cluster starts once per session, only when a selected test asks for it, and stops when the
session ends, unless it was already running (then whoever started it stops it). On a machine that
cannot run it (not root, not Debian) those tests skip with the reason.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
from collections.abc import Iterator

import pytest
from slurm_jobs import LOCAL, Cluster, machine_problem


@pytest.fixture(scope="session")
def slurm_cluster() -> Iterator[Cluster]:
    problem = machine_problem()
    if problem:
        pytest.skip(f"local SLURM cluster: {problem}")
    started = subprocess.run([str(LOCAL / "start.sh")], capture_output=True, text=True, timeout=900)
    if started.returncode != 0:
        pytest.fail(f"slurm/local/start.sh failed ({started.returncode}):\n{started.stderr}")
    ours = "already running" not in started.stderr
    conf = re.search(r"export SLURM_CONF=(\S+)", started.stdout).group(1)
    try:
        yield Cluster({**os.environ, "SLURM_CONF": conf})
    finally:
        if ours:
            subprocess.run([str(LOCAL / "stop.sh")], capture_output=True, text=True, timeout=300)


@pytest.fixture(autouse=True)
def no_job_outlives_its_test(request: pytest.FixtureRequest) -> Iterator[None]:
    """A job left running by a test (one that failed before its job ended) would hold the nodes
    that every later test's job waits for: stop it, with its stacks in its output."""
    yield
    if "slurm_cluster" not in request.fixturenames:
        return
    cluster = request.getfixturevalue("slurm_cluster")
    for job in cluster.unfinished_jobs():
        print(f"{request.node.nodeid} left job {job} unfinished: {cluster.stop(job)}")


@pytest.fixture(scope="session")
def shellcheck() -> str:
    """The shellcheck command; installed from Debian's package where missing and possible."""
    found = shutil.which("shellcheck")
    if found:
        return found
    problem = machine_problem()
    if problem:
        pytest.skip(f"shellcheck is not installed and cannot be: {problem}")
    install = ["apt-get", "install", "-y", "-q", "-o", "DPkg::Lock::Timeout=300", "--no-install-recommends",
               "shellcheck"]
    env = {**os.environ, "DEBIAN_FRONTEND": "noninteractive"}
    if subprocess.run(install, env=env, capture_output=True, timeout=900).returncode != 0:
        subprocess.run(["apt-get", "update", "-q"], env=env, capture_output=True, timeout=900, check=True)
        subprocess.run(install, env=env, capture_output=True, timeout=900, check=True)
    return shutil.which("shellcheck") or pytest.fail("shellcheck still missing after apt-get install")

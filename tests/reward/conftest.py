"""Fixtures of the reward tests: sandbox backends that work here, short limits, process checks."""

from __future__ import annotations

import functools
import os

import psutil
import pytest

from areal_hpc.config.schema import CodeSandboxConfig, RewardConfig
from areal_hpc.reward.sandbox import BACKENDS, Sandbox, SandboxUnavailable

# Short limits keep the time-out tests quick, yet leave room for a loaded 2-core machine.
LIMITS = dict(per_test_timeout_s=2.0, total_timeout_s=8.0, memory_mb=256, max_processes=16,
              max_output_bytes=64 * 1024)
# Every process started by the harness carries its source, hence this line, on its command line.
HARNESS_MARK = "The test driver that runs inside the sandbox"


def reward_config(backend: str, **code: object) -> RewardConfig:
    return RewardConfig(kind="code", workers=1, code=CodeSandboxConfig(**{**LIMITS, **code, "backend": backend}))


@functools.cache
def _unavailable(backend: str) -> str | None:
    try:
        Sandbox.detect(CodeSandboxConfig(**LIMITS, backend=backend))
    except SandboxUnavailable as e:
        return str(e)
    return None


@pytest.fixture(params=BACKENDS, scope="session")
def backend(request: pytest.FixtureRequest) -> str:
    """Each sandbox backend that works on this machine; the others skip with the probe's reason."""
    problem = _unavailable(request.param)
    if problem:
        pytest.skip(f"{request.param} backend unavailable here: {problem}")
    return request.param


@pytest.fixture(scope="session")
def sandbox(backend: str) -> Sandbox:
    return Sandbox.detect(CodeSandboxConfig(**LIMITS, backend=backend))


def sandbox_processes(marker: str = HARNESS_MARK) -> list[psutil.Process]:
    """Processes anywhere on the machine whose command line carries `marker`."""
    found = []
    for p in psutil.process_iter(["cmdline", "status"]):
        cmdline = p.info["cmdline"] or []
        if p.pid != os.getpid() and p.info["status"] != psutil.STATUS_ZOMBIE and any(marker in a for a in cmdline):
            found.append(p)
    return found

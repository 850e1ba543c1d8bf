"""Fixtures of the reward tests: the sandbox backends that work on this machine."""

from __future__ import annotations

import functools

import pytest
from sandbox_support import LIMITS

from areal_hpc.config.schema import CodeSandboxConfig
from areal_hpc.reward.sandbox import BACKENDS, Sandbox, SandboxUnavailable


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

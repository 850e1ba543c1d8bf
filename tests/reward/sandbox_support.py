"""Shared by the reward tests: short sandbox limits, configs built on them, and a search for
processes a sandbox run may have left behind."""

from __future__ import annotations

import contextlib
import os

import psutil

from areal_hpc.config.schema import CodeSandboxConfig, RewardConfig

# Short limits keep the time-out tests quick, yet leave room for a loaded 2-core machine.
LIMITS = dict(per_test_timeout_s=2.0, total_timeout_s=8.0, memory_mb=256, max_processes=16,
              max_output_bytes=64 * 1024)
# Every process started by the harness carries its source, hence this line, on its command line.
HARNESS_MARK = "The test driver that runs inside the sandbox"


def reward_config(backend: str, **code: object) -> RewardConfig:
    return RewardConfig(kind="code", workers=1, code=CodeSandboxConfig(**{**LIMITS, **code, "backend": backend}))


def sandbox_processes(marker: str = HARNESS_MARK) -> list[psutil.Process]:
    """Processes anywhere on the machine whose command line carries `marker`."""
    found = []
    for p in psutil.process_iter(["cmdline", "status"]):
        cmdline = p.info["cmdline"] or []
        if p.pid != os.getpid() and p.info["status"] != psutil.STATUS_ZOMBIE and any(marker in a for a in cmdline):
            found.append(p)
    return found


def run_processes(root: int) -> list[psutil.Process]:
    """Live processes below `root` but its sandboxes' spawners (they outlive runs)."""
    found = []
    for p in psutil.Process(root).children(recursive=True):
        with contextlib.suppress(psutil.NoSuchProcess):
            if not any(a.endswith(os.path.join("reward", "spawner.py")) for a in p.cmdline()):
                found.append(p)
    return found


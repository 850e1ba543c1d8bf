"""A sandboxed run's memory cgroup: where it is made, its limit, its removal, and what it stops
that the per-process limits let through (a program's memfds, memory spread over processes)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
from sandbox_support import reward_config

from areal_hpc.cli import main
from areal_hpc.config.schema import CodeSandboxConfig
from areal_hpc.reward.code_check import check_code
from areal_hpc.reward.code_tests import parse_tests
from areal_hpc.reward.memory_cgroup import (
    PREFIX,
    CgroupUnavailable,
    RunCgroup,
    _own_cgroup_v1,
    _own_cgroup_v2,
    find_parent,
    remove_orphans,
)
from areal_hpc.reward.sandbox import Sandbox
from areal_hpc.reward.task import CodeTask

V1_CGROUP = "5:devices:/\n4:memory:/jobs/42\n1:cpu,cpuacct:/\n0::/\n"
V2_CGROUP = "0::/system.slice/job_42/step_0\n"
MOUNTS = (
    "31 23 0:28 / /sys/fs/cgroup rw,relatime - tmpfs tmpfs rw,mode=755\n"
    "32 31 0:29 / /sys/fs/cgroup/cpu rw,relatime - cgroup cgroup rw,cpu\n"
    "35 31 0:31 /jobs /sys/fs/cgroup/memory rw,relatime shared:9 - cgroup cgroup rw,memory\n"
)
V2_MOUNTS = "40 23 0:40 / /sys/fs/cgroup rw,nosuid,nodev - cgroup2 cgroup2 rw,nsdelegate\n"
# 400 memfds of 1 MB each: every file under the output limit (RLIMIT_FSIZE) and never mapped, so
# no process's address space holds them.
MEMFDS = ("import os\nfds = []\nfor _ in range(400):\n    fd = os.memfd_create('x')\n"
          "    os.write(fd, b'x' * 1000000)\n    fds.append(fd)\nprint('held', len(fds))\n")
# 8 processes of 40 MB each, every one under the per-process limit.
SPREAD = ("import os, time\nkids = []\nfor _ in range(8):\n    pid = os.fork()\n    if pid == 0:\n"
          "        b = bytearray(40 << 20)\n        for i in range(0, len(b), 4096):\n            b[i] = 1\n"
          "        time.sleep(1)\n        os._exit(0)\n    kids.append(pid)\n"
          "print(sum(os.waitpid(k, 0)[1] == 0 for k in kids))\n")


def test_the_v1_memory_hierarchy_is_found_through_its_mount_root() -> None:
    # The mount shows the hierarchy from /jobs on (a cgroup namespace or a bind): the path is
    # the cgroup relative to it.
    assert _own_cgroup_v1(V1_CGROUP, MOUNTS) == Path("/sys/fs/cgroup/memory/42")
    assert _own_cgroup_v1("0::/\n", MOUNTS) is None
    assert _own_cgroup_v1(V1_CGROUP, MOUNTS.replace("rw,memory", "rw,blkio")) is None


def test_the_v2_cgroup_is_the_unified_line() -> None:
    assert _own_cgroup_v2(V2_CGROUP, V2_MOUNTS) == Path("/sys/fs/cgroup/system.slice/job_42/step_0")
    assert _own_cgroup_v2(V1_CGROUP, MOUNTS) is None  # a unified line, but no cgroup2 mount


def test_a_configured_parent_that_is_not_a_cgroup_is_named(tmp_path: Path) -> None:
    with pytest.raises(CgroupUnavailable, match="is not a directory"):
        find_parent(str(tmp_path / "missing"))
    with pytest.raises(CgroupUnavailable, match="is not a memory cgroup"):
        find_parent(str(tmp_path))


@pytest.mark.parametrize("value", ["cgroups/sandbox", "on", ""])
def test_the_setting_must_be_auto_off_or_an_absolute_path(tmp_path: Path, capsys, value: str) -> None:
    path = tmp_path / "exp.yaml"
    path.write_text(f"name: x\nreward:\n  kind: code\n  code:\n    memory_cgroup: '{value}'\n")
    assert main(["config", "check", str(path)]) == 2
    assert "reward.code.memory_cgroup" in capsys.readouterr().err


def test_off_runs_with_per_process_limits_and_says_so() -> None:
    sandbox = Sandbox.detect(CodeSandboxConfig(backend="rlimits", memory_cgroup="off", memory_mb=96))
    assert sandbox.cgroup is None
    assert "memory 96 MB per process only (no memory cgroup: reward.code.memory_cgroup is off)" in sandbox.describe()


@pytest.fixture(scope="module")
def parent():
    try:
        return find_parent("auto")
    except CgroupUnavailable as e:
        pytest.skip(f"no memory cgroup can be made here, so runs have per-process limits only: {e}")


def test_a_run_cgroup_is_limited_and_removed_with_what_is_left_in_it(parent) -> None:
    run = RunCgroup.make(parent, 64 << 20)
    limit = "memory.limit_in_bytes" if parent.version == 1 else "memory.max"
    assert int((run.path / limit).read_text()) == 64 << 20
    proc = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    try:
        run.add(proc.pid)
        run.remove()
        assert proc.wait(timeout=10) == -9
        assert not run.path.exists()
    finally:
        proc.kill()


def test_the_cgroups_of_a_dead_worker_are_removed(parent) -> None:
    dead = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True, text=True)
    orphan = parent.path / f"{PREFIX}{dead.stdout.strip()}-0badc0de"
    orphan.mkdir()
    mine = RunCgroup.make(parent, 64 << 20)
    try:
        remove_orphans(parent)
        assert not orphan.exists() and mine.path.exists()  # a live worker's run is left alone
    finally:
        mine.remove()
        if orphan.exists():
            orphan.rmdir()


@pytest.mark.parametrize("program, output", [(MEMFDS, "held 400"), (SPREAD, "8")], ids=["memfds", "processes"])
def test_memory_the_per_process_limit_misses_is_stopped(parent, backend: str, program: str, output: str) -> None:
    """What RLIMIT_AS lets through, shown by the same program with the cgroup off, is stopped by
    the run's cgroup, and the verdict names the limit."""
    config = reward_config(backend, memory_mb=96, per_test_timeout_s=10.0, total_timeout_s=20.0,
                           max_output_bytes=1 << 20)
    tests = parse_tests({"inputs": ["\n"], "outputs": [f"{output}\n"]})
    task = CodeTask(program, tests)
    config.code.memory_cgroup = "off"
    unlimited = check_code(task, config, Sandbox.detect(config.code))
    assert unlimited.reward == config.correct, unlimited  # the hole the cgroup closes
    config.code.memory_cgroup = "auto"
    sandbox = Sandbox.detect(config.code)
    assert "memory 96 MB per run (cgroup v" in sandbox.describe()
    verdict = check_code(task, config, sandbox)
    assert verdict.reward == config.wrong
    assert verdict.reason.startswith("memory limit of 96 MB for the run exceeded"), verdict
    # The worker's runs share its cgroup, one at a time: the next run starts with the whole limit
    # and no out-of-memory kill of its own.
    small = check_code(CodeTask("print(8)", parse_tests({"inputs": ["\n"], "outputs": ["8\n"]})), config, sandbox)
    assert small.reward == config.correct, small
    cgroup = sandbox.launcher.cgroup.path
    assert cgroup.parent == parent.path and cgroup.name.startswith(f"{PREFIX}{os.getpid()}-")
    sandbox.close()
    assert not cgroup.exists()

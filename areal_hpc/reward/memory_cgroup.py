"""A memory limit on one sandboxed run as a whole: a memory cgroup of its own.

RLIMIT_AS bounds each process's address space only. A run can still hold `memory_mb` in each of
`max_processes` processes, and memory that is nobody's mapping at all: a memfd or a tmpfs file
written with write() and never mapped (or mapped and unmapped again) stays allocated while a
descriptor holds it, counted against no process's limit. A cgroup counts every page the run's
processes are charged for (anonymous memory, shared memory and memfds, tmpfs files, page cache,
kernel memory), and the kernel's out-of-memory killer stops a process of the run, and only of the
run, when the run as a whole passes the limit, however it holds the memory.

Where the run's cgroup is made (`reward.code.memory_cgroup`):
- "auto": a child of the reward worker's own memory cgroup. Under cgroup v1 (a `memory` hierarchy,
  as on this project's development machines) a root service can always make one. Under cgroup v2
  the child gets a memory controller only if the worker's cgroup enables it for its children,
  which the kernel refuses while that cgroup holds processes of its own (the "no internal
  processes" rule): a worker inside a SLURM step's cgroup usually is such a process, so v2 needs
  the next form.
- a directory: a cgroup prepared for it (v1 or v2; under v2 with `+memory` in its
  cgroup.subtree_control and no processes of its own), e.g. made by the site's prolog.
- "off": per-process limits only.
Without a usable cgroup the sandbox still runs, with the per-process limits only, and says so once.

Each worker's runs share one cgroup, areal-sandbox-<worker pid>-<random>, one run at a time: the
worker's spawner process (reward/spawner.py) is moved in once, as root, and forks every run from
inside, so every process of a run, namespaces included, is inside from its first page (moving
each run in instead costs ~10 ms of a global kernel lock per run). Cgroups left by a worker killed
mid-run are removed by the next one.
"""

from __future__ import annotations

import contextlib
import os
import secrets
import signal
import time
from dataclasses import dataclass
from pathlib import Path

PREFIX = "areal-sandbox-"
# Seconds to wait for the killed processes of a run to leave its cgroup before removing it.
DRAIN_S = 5.0


class CgroupUnavailable(Exception):
    """No memory cgroup can be made for runs here; the message says why."""


@dataclass(frozen=True)
class CgroupParent:
    """The memory cgroup under which each run gets its own."""

    path: Path
    version: int  # 1 or 2

    def describe(self) -> str:
        return f"cgroup v{self.version} under {self.path}"


def _own_cgroup_v1(proc_cgroup: str, mountinfo: str) -> Path | None:
    """This process's cgroup in a v1 `memory` hierarchy, as a directory, if one is mounted."""
    own = next((line.split(":", 2)[2] for line in proc_cgroup.splitlines()
                if line.count(":") >= 2 and "memory" in line.split(":", 2)[1].split(",")), None)
    if own is None:
        return None
    for line in mountinfo.splitlines():
        fields = line.split()
        sep = fields.index("-")
        fstype, options = fields[sep + 1], fields[sep + 3] if len(fields) > sep + 3 else ""
        if fstype == "cgroup" and "memory" in options.split(","):
            root, mountpoint = fields[3], fields[4]
            return Path(mountpoint) / os.path.relpath(own, root)
    return None


def _own_cgroup_v2(proc_cgroup: str, mountinfo: str) -> Path | None:
    own = next((line[3:] for line in proc_cgroup.splitlines() if line.startswith("0::")), None)
    if own is None:
        return None
    for line in mountinfo.splitlines():
        fields = line.split()
        sep = fields.index("-")
        if fields[sep + 1] == "cgroup2":
            root, mountpoint = fields[3], fields[4]
            return Path(mountpoint) / os.path.relpath(own, root)
    return None


def _version_of(path: Path) -> int:
    """1 for a directory of a v1 memory hierarchy, 2 for a v2 cgroup."""
    if (path / "memory.limit_in_bytes").exists():
        return 1
    if (path / "cgroup.controllers").exists():
        return 2
    raise CgroupUnavailable(f"{path} is not a memory cgroup (neither memory.limit_in_bytes nor cgroup.controllers)")


def find_parent(setting: str) -> CgroupParent:
    """The parent for runs' cgroups that `setting` ("auto" or a directory) names, checked by making
    and removing one; raises CgroupUnavailable naming why there is none."""
    if setting == "auto":
        proc_cgroup = Path("/proc/self/cgroup").read_text()
        mountinfo = Path("/proc/self/mountinfo").read_text()
        v1 = _own_cgroup_v1(proc_cgroup, mountinfo)
        path = v1 if v1 is not None else _own_cgroup_v2(proc_cgroup, mountinfo)
        if path is None:
            raise CgroupUnavailable("no cgroup file system is mounted")
    else:
        path = Path(setting)
        if not path.is_dir():
            raise CgroupUnavailable(f"reward.code.memory_cgroup = {setting!r} is not a directory")
    parent = CgroupParent(path, _version_of(path))
    remove_orphans(parent)
    RunCgroup.make(parent, 1 << 30).remove()  # the check: a child can be made, limited and removed
    return parent


class RunCgroup:
    """One run's cgroup with its memory limit (swap included, so swapping is no way out)."""

    def __init__(self, parent: CgroupParent, path: Path) -> None:
        self.parent, self.path = parent, path

    @classmethod
    def make(cls, parent: CgroupParent, limit_bytes: int) -> RunCgroup:
        run = cls(parent, parent.path / f"{PREFIX}{os.getpid()}-{secrets.token_hex(4)}")
        try:
            run.path.mkdir()
        except OSError as e:
            raise CgroupUnavailable(f"cannot make a cgroup in {parent.path}: {e.strerror}") from e
        try:
            run._limit(limit_bytes)
        except BaseException:
            run.remove()
            raise
        return run

    def _limit(self, limit_bytes: int) -> None:
        if self.parent.version == 1:
            (self.path / "memory.limit_in_bytes").write_text(str(limit_bytes))
            swap = self.path / "memory.memsw.limit_in_bytes"  # absent without swap accounting
            if swap.exists():
                swap.write_text(str(limit_bytes))
            return
        limit = self.path / "memory.max"
        if not limit.exists():
            raise CgroupUnavailable(
                f"{self.parent.path} does not enable the memory controller for its children (cgroup v2 allows it"
                " only in a cgroup without processes of its own): set reward.code.memory_cgroup to a cgroup"
                " prepared for the sandbox")
        limit.write_text(str(limit_bytes))
        swap = self.path / "memory.swap.max"
        if swap.exists():
            swap.write_text("0")

    def add(self, pid: int) -> None:
        """Move a process in (its children then start inside)."""
        (self.path / "cgroup.procs").write_text(str(pid))

    def oom_kills(self) -> int:
        """Processes of the run the out-of-memory killer stopped for passing the limit."""
        name = "memory.oom_control" if self.parent.version == 1 else "memory.events"
        with contextlib.suppress(OSError):
            for line in (self.path / name).read_text().splitlines():
                key, _, value = line.partition(" ")
                if key == "oom_kill":
                    return int(value)
        return 0

    def kill_all(self, spare: int | None = None) -> None:
        """SIGKILL every process inside but `spare`, until they are gone (at most DRAIN_S)."""
        deadline = time.monotonic() + DRAIN_S
        while True:
            try:
                pids = [int(p) for p in (self.path / "cgroup.procs").read_text().split() if int(p) != spare]
            except FileNotFoundError:
                return
            if not pids or time.monotonic() > deadline:
                return
            for pid in pids:
                with contextlib.suppress(ProcessLookupError):
                    os.kill(pid, signal.SIGKILL)
            time.sleep(0.01)

    def remove(self) -> None:
        """Kill whatever is left inside, then remove the cgroup."""
        self.kill_all()
        with contextlib.suppress(FileNotFoundError, OSError):
            self.path.rmdir()


def remove_orphans(parent: CgroupParent) -> None:
    """Remove the cgroups of runs whose worker died mid-run (its pid no longer exists)."""
    for path in parent.path.glob(f"{PREFIX}*-*"):
        owner = path.name[len(PREFIX):].split("-")[0]
        if owner.isdigit() and not Path(f"/proc/{owner}").exists():
            with contextlib.suppress(OSError):
                RunCgroup(parent, path).remove()

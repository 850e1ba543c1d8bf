"""The processes of one test job, found by a marker variable in their environment (AREAL_TEST_JOB),
which mpiexec and srun pass to every rank and the ranks pass to their children. vLLM's engine
renames itself over its environment (setproctitle), so a rank's children are also found by process
group: mpiexec and srun start every rank as the leader of its own."""

from __future__ import annotations

import os
from pathlib import Path

MARKER = "AREAL_TEST_JOB"


def environ(proc: Path) -> list[bytes] | None:
    """The environment of a /proc/PID entry as NAME=VALUE items; None when it is gone or not ours."""
    try:
        return (proc / "environ").read_bytes().split(b"\0")
    except OSError:  # gone, or not ours to read
        return None


def job_pids(marker: str) -> list[int]:
    """Every live process of the job: ranks and their children."""
    return [int(p.name) for p in Path("/proc").iterdir()
            if p.name.isdigit() and f"{MARKER}={marker}".encode() in (environ(p) or [])]


def job_groups(marker: str) -> set[int]:
    """The process groups of the job's live ranks (take it while they run); never the caller's,
    which holds the launcher (mpiexec, srun) that also carries the marker."""
    groups = set()
    for pid in job_pids(marker):
        try:
            if b"PMI_RANK=" in b"\0".join(environ(Path(f"/proc/{pid}")) or []):
                groups.add(os.getpgid(pid))
        except ProcessLookupError:
            continue
    return groups - {os.getpgid(0)}


def running(pid: int) -> bool:
    """Alive and not on its way out: zombies, and processes whose memory is already released (an
    empty command line), have ended, even if their parent has not collected them yet."""
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(") ", 1)[1][0]
        return state not in "ZX" and bool(Path(f"/proc/{pid}/cmdline").read_bytes())
    except (OSError, IndexError):
        return False


def leftovers(marker: str, groups: set[int]) -> list[int]:
    """Processes still running of the job or of its ranks' process groups."""
    found = set(job_pids(marker))
    for p in Path("/proc").iterdir():
        if p.name.isdigit():
            try:
                if os.getpgid(int(p.name)) in groups:
                    found.add(int(p.name))
            except ProcessLookupError:
                continue
    return sorted(pid for pid in found if running(pid))


def start_time(pid: int) -> str | None:
    """When the process started (clock ticks since boot): a pid reused later has another."""
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(") ", 1)[1].split()[19]
    except (OSError, IndexError):
        return None


def snapshot(marker: str, groups: set[int]) -> dict[int, str | None]:
    """The job's running processes now, with their start times: what `survivors` checks later,
    when a requeued run of the same job (the same marker) may already have started its own."""
    return {pid: start_time(pid) for pid in leftovers(marker, groups)}


def survivors(before: dict[int, str | None]) -> list[int]:
    """The processes of `before` still running (the same pid and start time)."""
    return sorted(pid for pid, started in before.items() if running(pid) and start_time(pid) == started)


def rank_pid(rank: int, marker: str) -> int:
    """The launcher process of MPI rank `rank` (MPICH's mpiexec and SLURM's pmi2 set PMI_RANK)."""
    for pid in job_pids(marker):
        env = environ(Path(f"/proc/{pid}")) or []
        try:
            cmdline = Path(f"/proc/{pid}/cmdline").read_bytes()
        except OSError:
            continue
        if f"PMI_RANK={rank}".encode() in env and b"areal_hpc.launch" in cmdline:
            return pid
    raise LookupError(f"no process of rank {rank} in job {marker}")


def describe(pids: list[int]) -> dict[int, str]:
    """Command lines, for failure messages."""
    out = {}
    for pid in pids:
        try:
            out[pid] = Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
        except OSError:
            out[pid] = "(gone)"
    return out

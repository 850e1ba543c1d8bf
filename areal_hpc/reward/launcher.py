"""Starts a worker's sandboxed runs through its spawner process, inside one memory cgroup.

The spawner (reward/spawner.py) is started on the first run and again after it died; it joins
the cgroup made for this worker's runs once, so a run costs no cgroup move (see its docstring).
One run is in flight at a time, as the sandbox runs them, so the cgroup bounds each run as a
whole (the spawner's own ~10 MB counted in); what the out-of-memory killer stopped in a run is the
rise of the cgroup's counter over it, and whatever of a run is still inside afterwards is killed.
Cost: one extra process and socket per reward worker, whatever the number of ranks.
"""

from __future__ import annotations

import contextlib
import marshal
import os
import select
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

from areal_hpc.reward import spawner
from areal_hpc.reward.memory_cgroup import CgroupParent, RunCgroup

# Seconds the spawner may take to answer a request (a fork; the first also waits for its start).
ANSWER_TIMEOUT_S = 10.0


class SpawnerError(OSError):
    """The spawner could not start a run (it died, hung or refused); the message says which."""


class LaunchedRun:
    """A run's main process as a subprocess.Popen-like handle: its pipes, pid and exit code."""

    def __init__(self, launcher: Launcher, pid: int, stdin: int, stdout: int, stderr: int) -> None:
        self.launcher, self.pid = launcher, pid
        self.stdin = os.fdopen(stdin, "wb", buffering=0)
        self.stdout = os.fdopen(stdout, "rb", buffering=0)
        self.stderr = os.fdopen(stderr, "rb", buffering=0)
        self.returncode: int | None = None

    def wait(self, timeout: float | None = None) -> int:
        """Its exit code (negative: the signal); raises subprocess.TimeoutExpired."""
        if self.returncode is None:
            self.returncode = self.launcher.wait_exit(self.pid, timeout)
        return self.returncode


class Launcher:
    """The spawner process of one worker and the memory cgroup its runs start in (or none)."""

    def __init__(self, cgroup_parent: CgroupParent | None, limit_bytes: int) -> None:
        self.cgroup_parent, self.limit_bytes = cgroup_parent, limit_bytes
        self.cgroup: RunCgroup | None = None
        self.proc: subprocess.Popen | None = None
        self.sock: socket.socket | None = None
        self.exited: dict[int, int] = {}
        # Out-of-memory kills in the cgroups of earlier spawners (see oom_kills).
        self.earlier_oom_kills = 0

    def ensure_started(self) -> None:
        """Start the spawner (and make its cgroup) unless it is running."""
        if self.proc is not None and self.proc.poll() is None:
            return
        self.close()
        ours, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
        try:
            if self.cgroup_parent is not None:
                self.cgroup = RunCgroup.make(self.cgroup_parent, self.limit_bytes)
            self.proc = subprocess.Popen(
                [sys.executable, "-I", "-S", str(Path(spawner.__file__)), str(theirs.fileno())],
                stdin=subprocess.DEVNULL, pass_fds=(theirs.fileno(),), start_new_session=True)
            self.sock = ours
            if self.cgroup is not None:
                self.cgroup.add(self.proc.pid)  # before its first fork: it only forks on request
        except BaseException:
            ours.close()
            self.close()
            raise
        finally:
            theirs.close()

    def start(self, argv: list[str], env: dict[str, str], cwd: str, user: tuple[int, int] | None) -> LaunchedRun:
        """Start one run, as `user` (uid, gid) if given; its stdin, stdout and stderr are pipes to this process."""
        self.ensure_started()
        pipes = [os.pipe() for _ in range(3)]
        ends = [pipes[0][0], pipes[1][1], pipes[2][1]]  # the run's ends
        try:
            request = marshal.dumps({"argv": argv, "env": env, "cwd": cwd, "user": user})
            try:
                socket.send_fds(self.sock, [request], ends)
            except OSError as e:
                raise self._failed(f"the spawner took no request ({e})") from e
            deadline = time.monotonic() + ANSWER_TIMEOUT_S
            while (answer := self._receive(deadline)) is not None and answer[0] == "exited":
                self.exited[answer[1]] = answer[2]
            if answer is None:
                raise self._failed(f"the spawner did not answer within {ANSWER_TIMEOUT_S:g} s")
            if answer[0] == "eof":
                raise self._failed("the spawner died")
            if answer[0] != "started":
                raise SpawnerError(f"the spawner could not fork: {answer[1]}")
        except BaseException:
            for fd in (pipes[0][1], pipes[1][0], pipes[2][0]):
                os.close(fd)
            raise
        finally:
            for fd in ends:
                os.close(fd)
        return LaunchedRun(self, answer[1], pipes[0][1], pipes[1][0], pipes[2][0])

    def wait_exit(self, pid: int, timeout: float | None) -> int:
        deadline = None if timeout is None else time.monotonic() + timeout
        while pid not in self.exited:
            message = ("eof",) if self.sock is None else self._receive(deadline)
            if message is None:
                raise subprocess.TimeoutExpired(str(pid), timeout or 0.0)
            if message[0] == "eof":
                self.close()  # the spawner is gone, and the run with it (its parent-death signal)
                return -signal.SIGKILL
            if message[0] == "exited":
                self.exited[message[1]] = message[2]
        return self.exited.pop(pid)

    def oom_kills(self) -> int:
        """Out-of-memory kills so far in this launcher's cgroups (0 without one): a run's are the
        rise over it, even when the killer took the spawner and the cgroup went with it."""
        return self.earlier_oom_kills + (self.cgroup.oom_kills() if self.cgroup is not None else 0)

    def kill_leftovers(self) -> None:
        """Kill every process in the cgroup but the spawner: what a run left behind."""
        if self.cgroup is not None and self.proc is not None:
            self.cgroup.kill_all(spare=self.proc.pid)

    def close(self) -> None:
        """Stop the spawner and remove the cgroup (its processes killed)."""
        if self.sock is not None:
            self.sock.close()
            self.sock = None
        if self.proc is not None:
            with contextlib.suppress(ProcessLookupError):
                self.proc.kill()
            self.proc.wait()
            self.proc = None
        if self.cgroup is not None:
            self.cgroup.kill_all()
            self.earlier_oom_kills += self.cgroup.oom_kills()
            self.cgroup.remove()
            self.cgroup = None
        self.exited.clear()

    def _receive(self, deadline: float | None) -> tuple | None:
        """The spawner's next message, ("eof",) once it is gone, None at the deadline."""
        left = None if deadline is None else max(0.0, deadline - time.monotonic())
        if not select.select([self.sock], [], [], left)[0]:
            return None
        data = self.sock.recv(4096)
        return marshal.loads(data) if data else ("eof",)

    def _failed(self, why: str) -> SpawnerError:
        self.close()
        return SpawnerError(why)

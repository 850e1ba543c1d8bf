"""Running an untrusted program against test cases, isolated from the host.

Backends, strongest first. `reward.code.backend: auto` means bwrap, and refuses to start when
bwrap cannot run here: a weaker sandbox is used only when the config names it, never silently.

- `bwrap` (Bubblewrap, Debian package `bubblewrap`): new user, PID, network, IPC, UTS and mount
  namespaces; the root file system is an empty read-only tmpfs holding read-only binds of /usr
  (and the interpreter's prefix), a minimal read-only /dev and the namespace's /proc; the only
  writable place is the working directory, a fresh tmpfs of at most `memory_mb`; no
  capabilities; no network but a private loopback; the whole namespace dies with the run.
- `unshare` (util-linux): new user, PID, network, IPC, UTS and mount (for /proc) namespaces, so
  no network and every process dies with the run, but the host file system is visible (writes
  and reads limited only by file permissions).
- `rlimits`: no namespaces. Every process of the run is still killed (its process group, and
  detached ones through the calling process being a child subreaper); network and files are
  limited only by file permissions.

All backends: the run starts in a fresh temporary directory (also HOME and TMPDIR) that is deleted
afterwards (with `unshare` and `rlimits`, a host directory bounded only per file, by the output
limit); a service running as root runs programs as `nobody` (uid 65534), so root's files are
out of reach; resource limits on every test process (address space, CPU seconds, file size =
output limit, process count, no core files); a per-test wall-clock limit enforced by the harness
and a total one enforced here; the environment is replaced; programs get the interpreter's
standard library only (`python -I -S`).

Memory: RLIMIT_AS per process, and `memory_mb` for the run as a whole through a memory cgroup of
its own where one can be made (reward/memory_cgroup.py: cgroup v1, or v2 with a prepared parent);
without one, what holds is the per-process limit and, under bwrap, the working directory's tmpfs
of at most `memory_mb`, and a program can then hold memory in memfds (written, not mapped) or
across several processes. The worker logs which holds when it starts. Limits of the limits: the
process-count limit is exact with a user namespace (bwrap, unshare); with `rlimits` it counts
every process of the user, so it is set to the user's current count plus the allowance. If the
worker itself is killed mid-run, its spawner dies with it, and bwrap (--die-with-parent) and
unshare (--kill-child, PID namespace) take every process of the run with them; with `rlimits`
only the harness dies with it, and a process that had detached can outlive it (a busy one only
until its CPU-time limit).

Runs start from a spawner process per Sandbox (reward/launcher.py), which sits in the memory
cgroup, so a run costs no cgroup move. One run at a time per process: the sweep at the end kills
every new descendant of the caller.
"""

from __future__ import annotations

import ast
import ctypes
import logging
import marshal
import os
import secrets
import selectors
import shutil
import signal
import subprocess
import sys
import tempfile
import time
import weakref
from collections.abc import Callable
from contextlib import suppress
from dataclasses import dataclass
from pathlib import Path

import psutil

from areal_hpc.config.schema import CodeSandboxConfig
from areal_hpc.errors import UserError
from areal_hpc.reward import harness
from areal_hpc.reward.code_tests import TestCase, TestSuite
from areal_hpc.reward.launcher import LaunchedRun, Launcher, SpawnerError
from areal_hpc.reward.memory_cgroup import CgroupParent, CgroupUnavailable, find_parent

log = logging.getLogger(__name__)

BACKENDS = ("bwrap", "unshare", "rlimits")
# The user programs run as when the service runs as root.
SANDBOX_UID = 65534
SANDBOX_GID = 65534
# Where the working directory appears inside bwrap.
BWRAP_WORKDIR = "/sandbox"
# Host working directories (unshare, rlimits) are <tmp>/<prefix><pid of the owner>-<random>.
WORKDIR_PREFIX = "areal-sandbox-"
PR_SET_CHILD_SUBREAPER = 36
# Bytes of the harness's own stderr kept to explain a failed run.
STDERR_KEEP = 8192
# repr() escaping can grow output up to 4x (\x00); plus the other fields of a result line.
LINE_OVERHEAD = 16384
# Seconds for the spawner to report that a killed run ended, and for its strays to be gone.
KILL_WAIT_S = 10.0

_HARNESS_SOURCE = Path(harness.__file__).read_text()
_libc = ctypes.CDLL(None, use_errno=True)


class SandboxUnavailable(UserError):
    """The configured sandbox backend cannot run programs on this machine."""


@dataclass(frozen=True)
class CaseRun:
    """One test case as the harness saw it; judged against the expected output elsewhere."""

    index: int
    exit: int | None
    signal: int | None
    timed_out: bool
    # Processes of the case were still running after its main process exited.
    strays: bool
    truncated: bool
    # Standard output, the JSON of the return value for call tests, or for assert tests the JSON
    # of a failed assert (see harness.py).
    output: str
    # The last bytes of standard error.
    stderr: str
    # Assert tests: the test code ran to its end (the child wrote this run's mark); False otherwise.
    finished: bool


@dataclass
class RunResult:
    cases: list[CaseRun]
    # Why the run ended before every case ran (compile error, time limit, harness killed), if it did.
    error: str | None = None
    # Processes of the run its memory cgroup's out-of-memory killer stopped (the run as a whole
    # passed memory_mb); 0 without a cgroup.
    oom_kills: int = 0
    # False when the sandbox itself failed to start the run: says nothing about the program.
    started: bool = True


def _descendants(root: int) -> set[int]:
    """Every process below `root`, from the /proc children lists of its subtree.

    psutil's children(recursive=True) reads every process on the machine; this reads only the
    subtree, which matters because it runs twice per sandboxed program (two per sample). Kernels
    built without CONFIG_PROC_CHILDREN have no such lists: there psutil's scan is used."""
    if not os.path.exists(f"/proc/{root}/task/{root}/children"):
        return {p.pid for p in psutil.Process(root).children(recursive=True)}
    found: set[int] = set()
    todo = [root]
    while todo:
        pid = todo.pop()
        with suppress(OSError):
            for tid in os.listdir(f"/proc/{pid}/task"):
                with suppress(OSError), open(f"/proc/{pid}/task/{tid}/children") as f:
                    for child in map(int, f.read().split()):
                        if child not in found:
                            found.add(child)
                            todo.append(child)
    return found


def _remove_orphaned_workdirs() -> None:
    """Delete working directories left by processes killed mid-run (a worker the pool killed)."""
    for path in Path(tempfile.gettempdir()).glob(f"{WORKDIR_PREFIX}*-*"):
        owner = path.name[len(WORKDIR_PREFIX):].split("-")[0]
        if owner.isdigit() and not psutil.pid_exists(int(owner)):
            _remove_tree(str(path))


def _remove_tree(path: str) -> None:
    """Delete a working directory even if the program made parts of it unwritable."""

    def unlock(func, p, _exc) -> None:
        with suppress(OSError):
            os.chmod(os.path.dirname(p), 0o700)
            os.chmod(p, 0o700)
            func(p)

    shutil.rmtree(path, onerror=unlock)


def _bind_system(python: str) -> list[str]:
    """bwrap arguments exposing, read-only, /usr, its merged-/usr links and the interpreter."""
    args = ["--ro-bind", "/usr", "/usr"]
    for top in ("/bin", "/sbin", "/lib", "/lib32", "/lib64"):
        if os.path.islink(top):
            args += ["--symlink", os.readlink(top), top]
        elif os.path.isdir(top):
            args += ["--ro-bind", top, top]
    prefix = Path(python).parent.parent  # <prefix>/bin/python3
    if not prefix.is_relative_to("/usr"):
        args += ["--ro-bind", str(prefix), str(prefix)]
    return args


class Sandbox:
    """One backend, interpreter and set of limits; `run` executes a program against a suite."""

    def __init__(self, backend: str, python: str, limits: CodeSandboxConfig) -> None:
        self.backend = backend
        self.python = python
        self.limits = limits
        self.as_nobody = os.geteuid() == 0
        # The launcher's absolute path: programs start with PATH=/usr/bin:/bin.
        self.tool = shutil.which(backend) if backend != "rlimits" else None
        if backend != "bwrap":
            _remove_orphaned_workdirs()
        _libc.prctl(PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0)
        self.cgroup: CgroupParent | None = None
        self.no_cgroup = "reward.code.memory_cgroup is off"
        if limits.memory_cgroup != "off":
            try:
                self.cgroup = find_parent(limits.memory_cgroup)
            except (CgroupUnavailable, OSError) as e:
                self.no_cgroup = str(e)
        self.launcher = Launcher(self.cgroup, limits.memory_mb * 2**20)
        # The spawner and the cgroup go with close(), when this object does, or at exit.
        self.close = weakref.finalize(self, self.launcher.close)

    def describe(self) -> str:
        user = "nobody" if self.as_nobody else "the current user"
        mb = self.limits.memory_mb
        memory = (f"memory {mb} MB per run ({self.cgroup.describe()})" if self.cgroup is not None
                  else f"memory {mb} MB per process only (no memory cgroup: {self.no_cgroup})")
        return f"{self.backend} sandbox, {self.python}, as {user}, {memory}"

    @classmethod
    def detect(cls, limits: CodeSandboxConfig) -> Sandbox:
        """The first backend and interpreter that pass a probe run (see the module docstring)."""
        backends = (BACKENDS[0],) if limits.backend == "auto" else (limits.backend,)
        if limits.python:
            if not (os.path.isfile(limits.python) and os.access(limits.python, os.X_OK)):
                raise SandboxUnavailable(f"reward.code.python = {limits.python!r}: no executable file there on"
                                         f" this node (the interpreter that runs model-written programs)")
            pythons = [limits.python]
        else:
            pythons = list(dict.fromkeys(p for p in (os.path.realpath(sys.executable), "/usr/bin/python3")
                                         if os.path.isfile(p)))
        failures = []
        for backend in backends:
            for python in pythons:
                sandbox = cls(backend, python, limits)
                problem = sandbox.probe()
                if problem is None:
                    return sandbox
                failures.append(f"{backend} with {python}: {problem}")
        if limits.backend == "auto":
            raise SandboxUnavailable(
                "the bwrap sandbox cannot run here (" + "; ".join(failures) + "): install bubblewrap, or set"
                " reward.code.backend to unshare or rlimits to run model-written programs in a weaker sandbox"
                " (areal_hpc/reward/sandbox.py says what each one leaves open)")
        raise SandboxUnavailable("no sandbox backend works here: " + "; ".join(failures))

    def probe(self) -> str | None:
        """None if a trivial program runs and echoes its input, else what went wrong."""
        if self.backend != "rlimits" and self.tool is None:
            return f"{self.backend} is not installed"
        suite = TestSuite((TestCase("probe\n", "probe\n"),))
        result = self.run("print(input())", suite)
        if result.error:
            return result.error
        case = result.cases[0]
        if case.exit != 0 or case.output.strip() != "probe":
            return f"probe program failed (exit {case.exit}, signal {case.signal}): {case.stderr.strip()[-300:]}"
        return None

    def _command(self) -> list[str]:
        interpreter = [self.python, "-I", "-S", "-X", "utf8", "-c", _HARNESS_SOURCE]
        if self.backend == "rlimits":
            return interpreter
        if self.backend == "unshare":
            return [self.tool, "--user", "--net", "--pid", "--fork", "--kill-child", "--mount-proc", "--ipc",
                    "--uts", *interpreter]
        return [self.tool, "--unshare-all", "--die-with-parent", "--new-session", "--cap-drop", "ALL",
                *_bind_system(self.python), "--dev", "/dev", "--remount-ro", "/dev", "--proc", "/proc",
                "--size", str(self.limits.memory_mb * 2**20), "--tmpfs", BWRAP_WORKDIR, "--chdir", BWRAP_WORKDIR,
                "--remount-ro", "/", "--", *interpreter]

    def _environment(self, workdir: str) -> dict[str, str]:
        return {"PATH": "/usr/bin:/bin", "HOME": workdir, "TMPDIR": workdir, "LANG": "C.UTF-8"}

    def _nproc(self) -> int:
        """RLIMIT_NPROC for the run: exact in a user namespace, else relative to the user's count."""
        if self.backend != "rlimits":
            return self.limits.max_processes + 2  # the namespace's init and the harness
        uid = SANDBOX_UID if self.as_nobody else os.getuid()
        running = sum(1 for p in psutil.process_iter(["uids"]) if p.info["uids"] and p.info["uids"].real == uid)
        return running + self.limits.max_processes + 1

    def run(self, program: str, suite: TestSuite,
            keep_going: Callable[[CaseRun], bool] | None = None) -> RunResult:
        """Run every case (stopping early when keep_going returns False) within the total time limit."""
        lim = self.limits
        mark = secrets.token_hex(16)
        request = marshal.dumps({
            "program": program,
            "mode": suite.kind,
            "mark": mark,
            "fn_name": suite.fn_name,
            "inputs": [c.input for c in suite.cases],
            "per_test_timeout_s": lim.per_test_timeout_s,
            "memory_bytes": lim.memory_mb * 2**20,
            "max_output_bytes": lim.max_output_bytes,
            "nproc": self._nproc(),
        })
        # bwrap mounts a fresh tmpfs inside; the other backends get a fresh host directory.
        host_dir = None if self.backend == "bwrap" else tempfile.mkdtemp(prefix=f"{WORKDIR_PREFIX}{os.getpid()}-")
        workdir = host_dir or BWRAP_WORKDIR
        try:
            if self.as_nobody and host_dir:
                os.chown(host_dir, SANDBOX_UID, SANDBOX_GID)
            try:
                self.launcher.ensure_started()  # before `before`: the spawner outlives the run
                before = _descendants(os.getpid())
                oom_kills = self.launcher.oom_kills()
                proc = self.launcher.start(self._command(), self._environment(workdir), host_dir or "/",
                                           (SANDBOX_UID, SANDBOX_GID) if self.as_nobody else None)
            except (OSError, CgroupUnavailable, SpawnerError) as e:
                return RunResult([], f"the sandbox could not start: {e}", started=False)
            try:
                result = self._communicate(proc, request, len(suite.cases), mark, keep_going)
            finally:
                self._kill(proc, before)
                self.launcher.kill_leftovers()
            result.oom_kills = self.launcher.oom_kills() - oom_kills
            return result
        finally:
            if host_dir:
                _remove_tree(host_dir)

    def _communicate(self, proc: LaunchedRun, request: bytes, total: int, mark: str,
                     keep_going: Callable[[CaseRun], bool] | None) -> RunResult:
        lim = self.limits
        out_cap = total * (4 * (lim.max_output_bytes + 1) + LINE_OVERHEAD)
        deadline = time.monotonic() + lim.total_timeout_s
        result = RunResult([])
        pending, lines, err = memoryview(request), bytearray(), bytearray()
        received = 0
        with selectors.DefaultSelector() as sel:
            for stream, event in ((proc.stdin, selectors.EVENT_WRITE), (proc.stdout, selectors.EVENT_READ),
                                  (proc.stderr, selectors.EVENT_READ)):
                os.set_blocking(stream.fileno(), False)
                sel.register(stream, event)
            while sel.get_map():
                left = deadline - time.monotonic()
                if left <= 0:
                    result.error = f"total time limit of {lim.total_timeout_s:g} s exceeded"
                    return result
                for key, _ in sel.select(left):
                    stream = key.fileobj
                    if stream is proc.stdin:
                        try:
                            pending = pending[os.write(stream.fileno(), pending[:65536]):]
                        except BrokenPipeError:
                            pending = pending[:0]
                        if not pending:
                            sel.unregister(stream)
                            stream.close()
                        continue
                    data = os.read(stream.fileno(), 1 << 16)
                    if not data:
                        sel.unregister(stream)
                    elif stream is proc.stderr:
                        err += data[: max(0, STDERR_KEEP - len(err))]
                    else:
                        received += len(data)
                        if received > out_cap:
                            result.error = "the harness wrote more than the output limits allow"
                            return result
                        lines += data
                        while b"\n" in lines:
                            line, _, rest = bytes(lines).partition(b"\n")
                            lines = bytearray(rest)
                            if self._take(line, result, mark, keep_going) or len(result.cases) == total:
                                return result  # without waiting for the sandbox to wind down
        if len(result.cases) < total and result.error is None:
            with suppress(subprocess.TimeoutExpired):
                proc.wait(timeout=max(0.0, deadline - time.monotonic()))
            detail = err.decode("utf-8", "replace").strip()[-500:]
            result.error = f"the sandbox ended after {len(result.cases)} of {total} cases " \
                           f"(exit status {proc.returncode})" + (f": {detail}" if detail else "")
        return result

    @staticmethod
    def _take(line: bytes, result: RunResult, mark: str, keep_going: Callable[[CaseRun], bool] | None) -> bool:
        """Record one harness line; True when the run should end here."""
        try:
            obj = ast.literal_eval(line.decode())
            if "error" in obj:
                result.error = str(obj["error"])
                return True
            output = str(obj["output"])
            case = CaseRun(int(obj["i"]), obj["exit"], obj["signal"], bool(obj["timed_out"]), bool(obj["strays"]),
                           bool(obj["truncated"]), output, str(obj["stderr"]), output == mark)
        except (ValueError, KeyError, TypeError, SyntaxError, MemoryError, RecursionError):
            result.error = "the harness wrote a malformed result line"
            return True
        if case.index != len(result.cases):
            result.error = "the harness reported cases out of order"
            return True
        result.cases.append(case)
        return keep_going is not None and not keep_going(case)

    def _kill(self, proc: LaunchedRun, before: set[int]) -> None:
        """Kill the run's process group, then every new descendant of this process."""
        with suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGKILL)
        try:
            proc.wait(timeout=KILL_WAIT_S)
        except subprocess.TimeoutExpired:  # a stopped or hung spawner: the run dies with it
            log.error("sandbox: the spawner did not report the end of a killed run within %g s; restarting it",
                      KILL_WAIT_S)
            self.launcher.close()
        for stream in (proc.stdin, proc.stdout, proc.stderr):
            with suppress(OSError):
                stream.close()
        deadline = time.monotonic() + KILL_WAIT_S
        while strays := sorted(_descendants(os.getpid()) - before):
            if time.monotonic() > deadline:
                log.error("sandbox: processes of a run survived %g s of kill rounds: %s", KILL_WAIT_S, strays)
                return
            for pid in strays:
                with suppress(ProcessLookupError):
                    os.kill(pid, signal.SIGKILL)
            for pid in strays:  # ours if the spawner died (this process is a subreaper too)
                with suppress(ChildProcessError):
                    os.waitpid(pid, os.WNOHANG)
            time.sleep(0.001)  # the spawner reaps its own

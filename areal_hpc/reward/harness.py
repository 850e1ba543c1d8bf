"""The test driver that runs inside the sandbox: one forked child per test case.

It runs as `python -I -S -c <this file>`, with the standard library only (the package is not
visible in the sandbox), and imports little: its start-up is paid once per program. It reads one
request (marshal, from the trusted worker) on standard input and writes one line per test case to
standard output (a Python literal, which the worker reads with ast.literal_eval). For input/output
tests it never sees the expected outputs: verdicts are made outside, so a program that takes over
the harness can spoil its own run but cannot fake a pass.

Assert-style tests (HumanEval, MBPP) are Python that runs after the program in its namespace, so
the checking happens in the program's own process, as in those data sets' own evaluators. A case
passes only if, after the test code ran to its end, the child wrote the run's mark (a secret the
worker chose for this run) to its return file: a program that exits early (sys.exit, os._exit, a
signal) fails. A program written to subvert the test from inside its process (an object equal to
everything, patched modules, the mark read from memory) is beyond what this can rule out.

Each case runs in a forked child (no interpreter start-up per case) with the case's input and
output in memory files, its own process group, and the per-case resource limits. Afterwards
every process the case left behind is killed: its process group, and, since the harness is a
child subreaper, any descendant that detached into a new session. A case that leaves processes
running after its own process exits is reported (and fails): a judge cannot tell what they do.
"""

import _signal as signal  # the public module imports enum, which doubles the start-up time
import builtins
import ctypes
import marshal
import os
import resource
import select
import sys
import time

PR_SET_DUMPABLE = 4
PR_SET_CHILD_SUBREAPER = 36
STDERR_TAIL = 2048
RETURN_FD = 3  # a call case's child writes the JSON of the return value here, an assert case's its outcome
ASSERT_MESSAGE_KEEP = 1000  # characters of a failed assert's message sent back


def _prctl(option: int, value: int) -> None:
    ctypes.CDLL(None, use_errno=True).prctl(option, value, 0, 0, 0)


def _child_pids(parent: int) -> list:
    """Direct children of `parent`, from /proc (the harness has no psutil)."""
    pids = []
    for name in os.listdir("/proc"):
        if not name.isdigit():
            continue
        try:
            with open(f"/proc/{name}/stat", "rb") as f:
                stat = f.read()
        except OSError:
            continue
        if int(stat.rsplit(b")", 1)[1].split()[1]) == parent:
            pids.append(int(name))
    return pids


def _reap() -> bool:
    """Collect exited children; False once the harness has no child left."""
    try:
        while os.waitpid(-1, os.WNOHANG)[0]:
            pass
    except ChildProcessError:
        return False
    return True


def _kill_all(pgid: int, wakeup: int) -> None:
    """Kill a case's process group, then every remaining child until none is left."""
    try:
        os.killpg(pgid, signal.SIGKILL)
    except ProcessLookupError:
        pass
    while _reap():
        for pid in _child_pids(os.getpid()):
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
        select.select([wakeup], [], [], 0.05)
        _drain(wakeup)


def _drain(fd: int) -> None:
    try:
        while os.read(fd, 512):
            pass
    except BlockingIOError:
        pass


def _wait(pid: int, timeout: float, wakeup: int) -> tuple:
    """(wait status or None, timed out) for one child, woken by SIGCHLD through `wakeup`."""
    deadline = time.monotonic() + timeout
    while True:
        done, status = os.waitpid(pid, os.WNOHANG)
        if done:
            return status, False
        left = deadline - time.monotonic()
        if left <= 0:
            return None, True
        select.select([wakeup], [], [], left)
        _drain(wakeup)


def _memfile(name: str, data: bytes = b"") -> int:
    fd = os.memfd_create(name, 0)
    if data:
        os.write(fd, data)
        os.lseek(fd, 0, os.SEEK_SET)
    return fd


def _resolve(namespace: dict, fn_name: str):
    fn = namespace.get(fn_name)
    if callable(fn):
        return fn
    solution = namespace.get("Solution")
    if isinstance(solution, type) and callable(getattr(solution, fn_name, None)):
        return getattr(solution(), fn_name)
    raise NameError(f"the program defines neither {fn_name}() nor Solution.{fn_name}()")


def _failed_assert(exc: AssertionError, source: str):
    """The test's line whose assert failed, or None if the program (not the test) raised `exc`."""
    tb = exc.__traceback__
    while tb.tb_next is not None:
        tb = tb.tb_next
    if tb.tb_frame.f_code.co_filename != "<test>":
        return None
    lines = source.splitlines()
    return lines[tb.tb_lineno - 1].strip() if 0 < tb.tb_lineno <= len(lines) else "assert"


def _run_child(code, case, source, fds: tuple, req: dict) -> None:
    """In the forked child: redirect, limit, run the program (and an assert case's test); never
    returns. `case` is a call's arguments or an assert case's compiled test, `source` its text."""
    mode = req["mode"]
    stdin_fd, out_fd, err_fd, ret_fd = fds
    status = 1
    try:
        signal.set_wakeup_fd(-1)
        signal.signal(signal.SIGCHLD, signal.SIG_DFL)
        os.setpgid(0, 0)
        for fd, target in ((stdin_fd, 0), (out_fd, 1), (err_fd, 2), (ret_fd, RETURN_FD)):
            os.dup2(fd, target)
        os.closerange(RETURN_FD + 1, 1 << 16)
        cpu = int(req["per_test_timeout_s"]) + 1
        resource.setrlimit(resource.RLIMIT_CPU, (cpu, cpu + 1))
        resource.setrlimit(resource.RLIMIT_AS, (req["memory_bytes"],) * 2)
        resource.setrlimit(resource.RLIMIT_FSIZE, (req["max_output_bytes"] + 1,) * 2)
        sys.stdin = sys.__stdin__ = open(0, encoding="utf-8", errors="replace", closefd=False)
        sys.stdout = sys.__stdout__ = open(1, "w", encoding="utf-8", closefd=False)
        sys.stderr = sys.__stderr__ = open(2, "w", encoding="utf-8", closefd=False)
        namespace = {"__name__": "__main__" if mode == "stdio" else "solution", "__builtins__": builtins}
        exec(code, namespace)
        if mode == "call":
            import json

            value = _resolve(namespace, req["fn_name"])(*case)
            os.write(RETURN_FD, json.dumps(value, default=repr).encode())
        elif mode == "assert":
            exec(case, namespace)
            os.write(RETURN_FD, req["mark"].encode())
        status = 0
    except SystemExit as e:
        status = 0 if e.code in (None, 0) else 1
    except MemoryError:
        os.write(2, b"\nMemoryError: memory limit exceeded\n")
    except AssertionError as e:
        import traceback

        traceback.print_exc()
        line = _failed_assert(e, source) if mode == "assert" else None
        if line is not None:
            import json

            message = str(e)[:ASSERT_MESSAGE_KEEP]
            os.write(RETURN_FD, json.dumps({"assert": line, "message": message}).encode())
    except BaseException:
        import traceback  # only on failure: the import costs every passing case otherwise

        traceback.print_exc()
    try:
        sys.stdout.flush()
        sys.stderr.flush()
    except BaseException:
        status = 1
    os._exit(status)


def _run_case(code, tests: list, req: dict, index: int, wakeup: int) -> dict:
    stdio = req["mode"] == "stdio"
    case = req["inputs"][index]
    stdin = case.encode("utf-8", "surrogateescape") if stdio else b""
    fds = (_memfile("stdin", stdin), _memfile("stdout"), _memfile("stderr"), _memfile("return"))
    sys.stdout.flush()
    pid = os.fork()
    if pid == 0:
        _run_child(code, tests[index] if tests else case, case, fds, req)
    try:
        os.setpgid(pid, pid)
    except OSError:
        pass  # the child already did it, or already exited
    status, timed_out = _wait(pid, req["per_test_timeout_s"], wakeup)
    # Once the case's process is reaped, any child left (reparented here) outlived the case.
    strays = not timed_out and _reap()
    _kill_all(pid, wakeup)
    limit = req["max_output_bytes"]
    out = os.pread(fds[1] if stdio else fds[3], limit + 1, 0)
    # Standard output over the limit fails every mode: Python ignores SIGXFSZ, so a call or assert
    # case printing past RLIMIT_FSIZE would otherwise read as a runtime error (EFBIG).
    truncated = len(out) > limit or os.fstat(fds[1]).st_size > limit
    err_size = os.fstat(fds[2]).st_size
    err = os.pread(fds[2], STDERR_TAIL, max(0, err_size - STDERR_TAIL))
    for fd in fds:
        os.close(fd)
    return {
        "i": index,
        "exit": os.waitstatus_to_exitcode(status) if status is not None and os.WIFEXITED(status) else None,
        "signal": os.WTERMSIG(status) if status is not None and os.WIFSIGNALED(status) else None,
        "timed_out": timed_out,
        "strays": strays,
        "truncated": truncated,
        "output": out[:limit].decode("utf-8", "replace"),
        "stderr": err.decode("utf-8", "replace"),
    }


def main() -> None:
    req = marshal.loads(sys.stdin.buffer.read())
    if req["mode"] != "stdio":
        import json  # noqa: F401  loaded once here, so each case's child imports it for free
    _prctl(PR_SET_CHILD_SUBREAPER, 1)
    _prctl(PR_SET_DUMPABLE, 0)  # a case cannot open /proc/<harness>/fd or ptrace the harness
    resource.setrlimit(resource.RLIMIT_NPROC, (req["nproc"],) * 2)
    resource.setrlimit(resource.RLIMIT_CORE, (0, 0))
    wakeup_r, wakeup_w = os.pipe2(os.O_NONBLOCK | os.O_CLOEXEC)
    signal.set_wakeup_fd(wakeup_w)
    signal.signal(signal.SIGCHLD, lambda signum, frame: None)
    try:
        code = compile(req["program"], "<program>", "exec")
        tests = [compile(src, "<test>", "exec") for src in req["inputs"]] if req["mode"] == "assert" else []
    except (SyntaxError, ValueError) as e:
        print(repr({"error": f"{type(e).__name__}: {e}"}), flush=True)
        return
    for index in range(len(req["inputs"])):
        print(repr(_run_case(code, tests, req, index, wakeup_r)), flush=True)


if __name__ == "__main__":
    main()

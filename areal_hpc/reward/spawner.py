"""The process that starts every sandboxed run of one reward worker (reward/launcher.py drives it).

Why a process of its own: each run must be inside a memory cgroup from its first page, and moving
a process into a cgroup (a write to cgroup.procs) takes the kernel's global cgroup lock and waits
for an RCU grace period: ~10 ms of wall time per run on cgroup v1, during which every fork on the
machine waits too. A forked child starts in its parent's cgroup for free. So this process joins
the worker's run cgroup once, when it starts, and forks each run from inside it.

It runs as `python -I -S spawner.py FD` (standard library only), FD a SOCK_SEQPACKET socket to
the worker. Each request (marshal) is {"argv", "env", "cwd", "user": (uid, gid) or None} with the
run's standard input, output and error as three passed descriptors; the answer is ("started",
pid) or ("failed", reason), then ("exited", pid, exit code) when that process ends. The run gets
its own session, the sandbox's user (as root), the out-of-memory killer's first pick and SIGKILL
when this process dies. Processes a run orphans re-parent here (a child subreaper) and are
reaped. It exits when the worker closes the socket, and dies with the worker (parent-death
signal).
"""

import ctypes
import marshal
import os
import select
import signal
import socket
import sys

PR_SET_PDEATHSIG = 1
PR_SET_CHILD_SUBREAPER = 36
REQUEST_BYTES = 1 << 20


def _exec_run(request: dict, fds: list) -> None:
    """In the forked child: become the run's process and exec its argv; never returns."""
    try:
        os.setsid()
        for target, fd in enumerate(fds):  # received descriptors are all above 2: no clobbering
            os.dup2(fd, target)
        os.closerange(3, 1 << 16)
        # The out-of-memory killer's first pick, before the spawner (its children inherit this).
        with open("/proc/self/oom_score_adj", "w") as f:
            f.write("1000")
        if request["user"] is not None:
            uid, gid = request["user"]
            os.setgroups([])
            os.setgid(gid)
            os.setuid(uid)
        # After the user change, which clears the request.
        ctypes.CDLL(None).prctl(PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0)
        os.chdir(request["cwd"])
        os.execve(request["argv"][0], request["argv"], request["env"])
    except BaseException as e:  # noqa: BLE001 - reported on the run's stderr, the worker reads it
        os.write(2, f"spawner: cannot start the run: {e}\n".encode())
    os._exit(127)


def main() -> None:
    libc = ctypes.CDLL(None)
    libc.prctl(PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0)
    if os.getppid() == 1:
        return  # the worker died before the request above took effect
    libc.prctl(PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0)
    sock = socket.socket(fileno=int(sys.argv[1]))
    wake_r, wake_w = os.pipe()
    os.set_blocking(wake_w, False)
    signal.set_wakeup_fd(wake_w)
    signal.signal(signal.SIGCHLD, lambda *_: None)
    running = set()
    while True:
        ready, _, _ = select.select([sock, wake_r], [], [])
        if wake_r in ready:
            os.read(wake_r, 4096)
            while True:
                try:
                    pid, status = os.waitpid(-1, os.WNOHANG)
                except ChildProcessError:
                    break
                if pid == 0:
                    break
                if pid in running:
                    running.discard(pid)
                    sock.send(marshal.dumps(("exited", pid, os.waitstatus_to_exitcode(status))))
        if sock in ready:
            data, fds, _, _ = socket.recv_fds(sock, REQUEST_BYTES, 3)
            if not data:
                return
            try:
                request = marshal.loads(data)
                if len(fds) != 3:
                    raise ValueError(f"expected 3 descriptors, got {len(fds)}")
                pid = os.fork()
            except (ValueError, EOFError, TypeError, OSError) as e:
                sock.send(marshal.dumps(("failed", str(e))))
            else:
                if pid == 0:
                    _exec_run(request, fds)
                running.add(pid)
                sock.send(marshal.dumps(("started", pid)))
            for fd in fds:
                os.close(fd)


if __name__ == "__main__":
    sys.exit(main())

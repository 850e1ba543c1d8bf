"""Hostile programs through the reward pool, on every sandbox backend that works here.

Each program is real and runs for real. Where the attack itself would produce the expected output
(reading the secret, connecting, writing outside, allocating), a pass would mean an escape. Every
program must fail with a reason, leave no process behind, and the pool must then serve a normal
task. What a fallback backend cannot guarantee (see areal_hpc/reward/sandbox.py) skips with that
reason instead of passing vacuously.

Each program runs twice: against its input/output tests, and through assert-style (MBPP) tests,
where the assert's call runs the program and checks what it printed.
"""

from __future__ import annotations

import asyncio
import os
import re
import secrets
import shutil
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path
from typing import NamedTuple

import pytest
from sandbox_support import reward_config, run_processes, sandbox_processes

from areal_hpc.reward.code_tests import TestSuite, parse_tests
from areal_hpc.reward.pool import RewardPool
from areal_hpc.reward.task import CodeTask, Verdict

ADD = parse_tests({"inputs": ["1 2\n", "3 4\n"], "outputs": ["3\n", "7\n"]})
ADD_PROGRAM = "a, b = map(int, input().split())\nprint(a + b)\n"
AS_ROOT = os.geteuid() == 0
# How the verdict of a run its memory cgroup stopped begins (96: the pool's memory_mb below).
RUN_LIMIT = "memory limit of 96 MB for the run exceeded"

# The program's source goes above this: solve(stdin) runs it with that standard input, passing what
# it prints on to the real standard output (so the output limit still applies) and returning it.
SOLVE = """
import io, sys


class _Tee(io.TextIOBase):
    def __init__(self):
        self.kept = ""

    def write(self, text):
        sys.__stdout__.write(text)
        self.kept += text[: max(0, 65536 - len(self.kept))]
        return len(text)


def solve(stdin):
    sys.stdin = io.StringIO(stdin)
    sys.stdout = tee = _Tee()
    try:
        exec(PROGRAM, {"__name__": "__main__"})
    finally:
        sys.stdout = sys.__stdout__
    return tee.kept
"""


def through_asserts(program: str, tests: TestSuite) -> tuple[str, TestSuite]:
    """The program and its input/output cases as MBPP tests: one assert per case, whose message
    is what the program printed."""
    lines = [f"assert (out := solve({c.input!r})).split() == {str(c.expected).split()!r}, out" for c in tests.cases]
    return f"PROGRAM = {program!r}\n" + SOLVE, parse_tests({"test_list": lines})


def _one_case(expected: str) -> TestSuite:
    return parse_tests({"inputs": ["1 2\n"], "outputs": [expected]})


class Served(NamedTuple):
    runner: asyncio.Runner
    pool: RewardPool
    # "stdio" (the input/output tests) or "asserts" (through_asserts)
    shape: str


@pytest.fixture(scope="module")
def pool_of_backend(backend: str) -> Iterator[tuple[asyncio.Runner, RewardPool]]:
    """One pool per backend for the module, driven from a persistent event loop. The total time
    limit is generous: on the loaded 2-core machine a run can stall for seconds. The small memory
    limit (also bwrap's working-directory size) makes the bombs hit it within a fraction of that."""
    runner = asyncio.Runner()
    pool = runner.run(RewardPool(reward_config(backend, total_timeout_s=10.0, memory_mb=96)).start())
    try:
        yield runner, pool
    finally:
        runner.run(pool.close())
        runner.close()


@pytest.fixture(params=["stdio", "asserts"])
def served(request: pytest.FixtureRequest, pool_of_backend: tuple[asyncio.Runner, RewardPool]) -> Served:
    return Served(*pool_of_backend, request.param)


def contained(served: Served, program: str, tests: TestSuite = ADD) -> Verdict:
    """Score a hostile program (in the served shape) and check the aftermath; returns its verdict."""
    runner, pool, shape = served

    def score(program: str, tests: TestSuite) -> Verdict:
        task = CodeTask(*through_asserts(program, tests)) if shape == "asserts" else CodeTask(program, tests)
        return runner.run(pool.score(task))

    verdict = score(program, tests)
    assert verdict.reward == pool.config.wrong and verdict.reason, verdict
    for pid in pool.worker_pids():
        assert pid is not None and run_processes(pid) == []
    assert sandbox_processes() == []
    assert score(ADD_PROGRAM, ADD) == Verdict(pool.config.correct, 2, 2, "passed 2/2 tests", correct=True)
    return verdict


def test_fork_bomb(served) -> None:
    program = "import os\nwhile True:\n    try:\n        os.fork()\n    except OSError:\n        pass\n"
    start = time.monotonic()
    verdict = contained(served, program)
    assert time.monotonic() - start < 20
    assert "time limit" in verdict.reason or "exceeded" in verdict.reason


def test_process_count_limit(served) -> None:
    program = (
        "import os, time\n"
        "children = []\n"
        "for _ in range(200):\n"
        "    try:\n"
        "        pid = os.fork()\n"
        "    except OSError:\n"
        "        break\n"
        "    if pid == 0:\n"
        "        time.sleep(30)\n"
        "        os._exit(0)\n"
        "    children.append(pid)\n"
        "for pid in children:\n"
        "    os.kill(pid, 9)\n"
        "    os.waitpid(pid, 0)\n"
        "print(len(children))\n"
    )
    verdict = contained(served, program, _one_case("200"))
    got = int(re.findall(r"\d+", verdict.reason)[-1])  # what it printed: the last number of the reason
    assert got < served[1].config.code.max_processes


def test_memory_bomb(served) -> None:
    # First 8 GiB of address space at once (refused at once under the limit, whatever the load),
    # then 4 GiB actually written.
    program = (
        "blocks = [bytearray(8 << 30)]\n"
        "for _ in range(256):\n"
        "    blocks.append(b'x' * (16 << 20))\n"
        "print('allocated')\n"
    )
    verdict = contained(served, program, _one_case("allocated"))
    # The process's address-space limit, or first the run's memory cgroup where there is one.
    assert ("MemoryError: memory limit exceeded" in verdict.reason
            or verdict.reason.startswith(RUN_LIMIT)), verdict.reason


def test_infinite_loop(served) -> None:
    verdict = contained(served, "while True:\n    pass\n")
    assert "time limit" in verdict.reason


def test_detached_child_outliving_the_run(served) -> None:
    marker = f"{secrets.randbelow(10**6)}.4242"  # a unique sleep duration to look for afterwards
    program = (
        "import os\n"
        "if os.fork() == 0:\n"
        "    os.setsid()\n"
        "    if os.fork() == 0:\n"
        f"        os.execv('/bin/sleep', ['sleep', '{marker}'])\n"
        "    os._exit(0)\n"
        + ADD_PROGRAM
    )
    verdict = contained(served, program)
    assert "left processes running" in verdict.reason
    assert sandbox_processes(marker) == []


def test_writing_outside_the_working_directory(served) -> None:
    if served[1].config.code.backend != "bwrap":
        pytest.skip("only bwrap isolates the file system; the fallbacks rely on file permissions")
    target = Path(tempfile.mkdtemp(prefix="areal-hostile-"))
    stray = Path(tempfile.gettempdir()) / f"areal-escape-{secrets.token_hex(4)}"
    try:
        target.chmod(0o777)  # writable by anyone who can see it
        program = (
            "written = []\n"
            f"for path in ({str(target / 'escaped.txt')!r}, {str(stray)!r}, '/usr/escaped', '/escaped'):\n"
            "    try:\n"
            "        open(path, 'w').write('x')\n"
            "        written.append(path)\n"
            "    except OSError:\n"
            "        pass\n"
            "print('escaped' if written else 'contained')\n"
        )
        verdict = contained(served, program, _one_case("escaped"))
        assert "wrong answer" in verdict.reason
        assert list(target.iterdir()) == [] and not stray.exists()
    finally:
        shutil.rmtree(target)
        stray.unlink(missing_ok=True)


def test_filling_the_disk(served) -> None:
    if served[1].config.code.backend != "bwrap":
        pytest.skip("only bwrap bounds the working directory (a tmpfs); the fallbacks bound each file")
    program = (
        "chunk = b'x' * (60 << 10)  # under the output limit, which also caps each file\n"
        "for i in range(40_000):  # 2.3 GiB in all\n"
        "    with open(f'fill{i}', 'wb') as f:\n"
        "        f.write(chunk)\n"
        "print('filled')\n"
    )
    verdict = contained(served, program, _one_case("filled"))
    # The tmpfs is full, or first the run's memory cgroup, which its pages are charged to.
    assert "No space left on device" in verdict.reason or verdict.reason.startswith(RUN_LIMIT), verdict.reason


def test_reading_a_secret_outside_the_working_directory(served) -> None:
    isolated = served[1].config.code.backend == "bwrap"
    if not isolated and not AS_ROOT:
        pytest.skip("the fallbacks hide files only by permissions, and this program runs as the same user")
    folder = Path(tempfile.mkdtemp(prefix="areal-hostile-"))
    try:
        folder.chmod(0o755)
        secret = folder / "secret.txt"
        secret.write_text(token := secrets.token_hex(16))
        # bwrap: readable by anyone, so only the sandbox's view of the file system hides it;
        # fallbacks as root: the program runs as nobody and the file is root's alone.
        secret.chmod(0o644 if isolated else 0o600)
        program = f"print(open({str(secret)!r}).read())\n"
        verdict = contained(served, program, _one_case(token))
        assert "Error" in verdict.reason
    finally:
        shutil.rmtree(folder)


def test_connecting_to_a_local_socket(served) -> None:
    if served[1].config.code.backend == "rlimits":
        pytest.skip("the rlimits backend has no network namespace")
    with socket.socket() as listener:
        listener.bind(("127.0.0.1", 0))
        listener.listen(8)
        port = listener.getsockname()[1]
        program = (
            "import socket\n"
            f"socket.create_connection(('127.0.0.1', {port}), timeout=1)\n"
            "print('connected')\n"
        )
        verdict = contained(served, program, _one_case("connected"))
        assert "runtime error" in verdict.reason
        listener.setblocking(False)
        with pytest.raises(BlockingIOError):
            listener.accept()  # nothing ever connected


def test_printing_gigabytes(served) -> None:
    program = "import sys\nchunk = 'x' * (1 << 20)\nfor _ in range(4096):\n    sys.stdout.write(chunk)\n"
    start = time.monotonic()
    verdict = contained(served, program)
    assert "output limit exceeded" in verdict.reason
    assert time.monotonic() - start < 20


_ANCESTORS = (
    "import os, signal, time\n"
    "pid, chain = os.getpid(), []\n"
    "while True:\n"
    "    with open(f'/proc/{pid}/stat') as f:\n"
    "        pid = int(f.read().rsplit(')', 1)[1].split()[1])\n"
    "    if pid == 0:\n"
    "        break\n"
    "    chain.append(pid)\n"
)


def _harness_is_init(served) -> bool:
    """Skip where the program could reach the test itself; True where the harness is its PID
    namespace's init (unshare), which the kernel shields from signals sent inside the namespace."""
    backend = served[1].config.code.backend
    if backend == "rlimits" and not AS_ROOT:
        pytest.skip("without namespaces or a separate user, the program could signal the test itself")
    return backend == "unshare"


def test_signalling_the_parent(served) -> None:
    shielded = _harness_is_init(served)
    program = _ANCESTORS + (
        "for p in chain:\n"
        "    try:\n"
        "        os.kill(p, signal.SIGKILL)\n"
        "    except OSError:\n"
        "        pass\n"
        "time.sleep(0.5)\n"
    )
    start = time.monotonic()
    verdict = contained(served, program)
    assert time.monotonic() - start < 20
    assert ("wrong answer" if shielded else "the sandbox ended") in verdict.reason


def test_stopping_the_parent(served) -> None:
    shielded = _harness_is_init(served)
    program = _ANCESTORS + (
        "for p in chain:\n"
        "    try:\n"
        "        os.kill(p, signal.SIGSTOP)\n"
        "    except OSError:\n"
        "        pass\n"
        "print('stopped')\n"
    )
    verdict = contained(served, program)
    assert ("wrong answer" if shielded else "total time limit") in verdict.reason


def test_walking_proc(served) -> None:
    """A program that reads every process's command line and environment it can find sees only its
    own run's processes, not a secret a process outside holds in both."""
    if served[1].config.code.backend == "rlimits":
        pytest.skip("the rlimits backend has no PID namespace: any user may read other processes' command lines")
    token = secrets.token_hex(16)
    holder = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(120)", token],
                              env={**os.environ, "AREAL_HOSTILE_SECRET": token})
    try:
        program = (
            "import os\n"
            "seen, found = 0, False\n"
            "for name in os.listdir('/proc'):\n"
            "    if not name.isdigit():\n"
            "        continue\n"
            "    seen += 1\n"
            "    for part in ('cmdline', 'environ'):\n"
            "        try:\n"
            f"            found |= {token!r}.encode() in open(f'/proc/{{name}}/{{part}}', 'rb').read()\n"
            "        except OSError:\n"
            "            pass\n"
            "print('found' if found else f'saw {seen}')\n"
        )
        verdict = contained(served, program, _one_case("found"))
        assert "wrong answer" in verdict.reason, verdict.reason
    finally:
        holder.kill()
        holder.wait()


def test_writing_to_dev_shm(served) -> None:
    """Shared memory is no channel out of a run: the program's /dev is its own and read-only."""
    if served[1].config.code.backend != "bwrap":
        pytest.skip("only bwrap gives the program a /dev of its own; the fallbacks share the host's /dev/shm")
    name = f"areal-escape-{secrets.token_hex(4)}"
    program = (
        "from multiprocessing import shared_memory\n"
        "written = []\n"
        f"for path in ('/dev/shm/{name}', '/dev/{name}'):\n"
        "    try:\n"
        "        open(path, 'w').write('x')\n"
        "        written.append(path)\n"
        "    except OSError:\n"
        "        pass\n"
        "try:\n"
        f"    shared_memory.SharedMemory('{name}-posix', create=True, size=4096)\n"
        "    written.append('posix')\n"
        "except OSError:\n"
        "    pass\n"
        "print('escaped' if written else 'contained')\n"
    )
    try:
        verdict = contained(served, program, _one_case("escaped"))
        assert "wrong answer" in verdict.reason, verdict.reason
        assert not [p for p in Path("/dev/shm").iterdir() if p.name.startswith(name)]
    finally:
        for p in Path("/dev/shm").glob(f"{name}*"):
            p.unlink()

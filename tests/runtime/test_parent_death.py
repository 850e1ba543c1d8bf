"""A rank's children die with it (runtime/parent_death.py): real processes, a real SIGKILL."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time

import pytest
from job_processes import running

# A middle process starts a child that sleeps (after asking to die with its parent when `guarded`)
# and prints the child's pid; then the test kills the middle process.
MIDDLE = """
import subprocess, sys, time
child = "import time\\n" + ("from areal_hpc.runtime.parent_death import die_with_parent\\ndie_with_parent()\\n"
                          if sys.argv[1] == "1" else "") + "print('ready', flush=True)\\ntime.sleep(120)"
p = subprocess.Popen([sys.executable, "-c", child], stdout=subprocess.PIPE, text=True)
assert p.stdout.readline().strip() == "ready"
print(p.pid, flush=True)
time.sleep(120)
"""


@pytest.mark.parametrize("guarded", [True, False])
def test_child_dies_with_its_killed_parent(guarded: bool) -> None:
    middle = subprocess.Popen([sys.executable, "-c", MIDDLE, "1" if guarded else "0"],
                              stdout=subprocess.PIPE, text=True)
    child = int(middle.stdout.readline())
    try:
        os.kill(middle.pid, signal.SIGKILL)
        middle.wait()
        deadline = time.monotonic() + 5
        while running(child) and time.monotonic() < deadline:
            time.sleep(0.05)
        # Unguarded, the orphan lives on: the case the guard exists for.
        assert running(child) is not guarded
    finally:
        if running(child):
            os.kill(child, signal.SIGKILL)

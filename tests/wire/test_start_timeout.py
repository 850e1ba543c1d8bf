"""The start deadline ends a rank stuck where no lifeline can see it, even inside a C call that
holds the interpreter lock (as MPI_Init does)."""

from __future__ import annotations

import subprocess
import sys
import time

import pytest

from areal_hpc.errors import UserError
from areal_hpc.wire.start_timeout import DEFAULT_START_TIMEOUT_S, START_TIMEOUT_ENV, start_timeout_s

STUCK = """
import re
from areal_hpc.wire.start_timeout import start_deadline
with start_deadline(1.0):
    re.match(r"(a+)+$", "a" * 40 + "b")  # minutes in C, under the interpreter lock
"""

DONE = """
from areal_hpc.wire.start_timeout import start_deadline
import time
with start_deadline(0.5):
    pass
time.sleep(1.5)  # past the deadline, outside the block: nothing fires
print("alive")
"""


def test_a_rank_stuck_in_a_c_call_is_ended_with_its_stack():
    start = time.monotonic()
    out = subprocess.run([sys.executable, "-c", STUCK], capture_output=True, text=True, timeout=60)
    assert out.returncode == 1, out.stderr
    assert "Timeout" in out.stderr and "line 5" in out.stderr, out.stderr
    assert time.monotonic() - start < 30


def test_the_deadline_ends_with_its_block():
    out = subprocess.run([sys.executable, "-c", DONE], capture_output=True, text=True, timeout=60)
    assert (out.returncode, out.stdout.strip()) == (0, "alive"), out.stderr


@pytest.mark.parametrize("raw", ["soon", "0", "-5", "nan", "inf"])
def test_a_bad_timeout_is_named(monkeypatch, raw):
    monkeypatch.setenv(START_TIMEOUT_ENV, raw)
    with pytest.raises(UserError, match=START_TIMEOUT_ENV):
        start_timeout_s()


def test_the_timeout_defaults_and_can_be_set(monkeypatch):
    monkeypatch.delenv(START_TIMEOUT_ENV, raising=False)
    assert start_timeout_s() == DEFAULT_START_TIMEOUT_S
    monkeypatch.setenv(START_TIMEOUT_ENV, "30")
    assert start_timeout_s() == 30.0

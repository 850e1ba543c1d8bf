"""Every benchmark's --quick mode, run as a user runs it (its report into a temporary --out), so
that none breaks unseen when the code it measures changes. Those whose --quick another test runs,
and those whose --quick still runs whole RL jobs on this machine, are listed apart; the lists must
cover every benchmark that has a --quick mode."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

BENCHMARKS = Path("benchmarks")
# Script -> (seconds its --quick took on the 2-core development machine, what it writes).
RUN = {
    "packing": (1, "packing.json"),
    "reward": (16, "reward.json"),
    "sim_paper": (29, "sim_paper.json"),
    "control_plane": (36, "control_plane.json"),
    "train_step": (37, "train_step.json"),
    "generation": (160, "generation.json"),
    "weight_sync": (231, "weight_sync.json"),
    "chaos": (150, "chaos.json"),
}
# Whose --quick its own test runs, checking its report.
ELSEWHERE = {"launch_check": "tests/benchmarks/test_launch_check.py"}
# Whose --quick is whole quickstart jobs (and the warm start's minutes on a fresh machine): run by
# hand, not in the suite.
HEAVY = {
    "async_vs_sync": "two quickstart jobs (eta 0 and 4)",
    "faults": "quickstart jobs with ranks killed, hung and failing",
    "sim_validation": "several quickstart-sized jobs of measured steps",
    "staleness_gate": "quickstart jobs at eta 1 beside the simulation",
    "staleness_quality": "10 quickstart jobs (3 etas x 2 objectives x 2 seeds, 4 steps)",
}


def test_every_quick_mode_is_run_here_or_listed_as_heavy() -> None:
    with_quick = {p.stem for p in BENCHMARKS.glob("*.py") if '"--quick"' in p.read_text()}
    assert with_quick == RUN.keys() | ELSEWHERE.keys() | HEAVY.keys()
    assert len(RUN) + len(ELSEWHERE) + len(HEAVY) == len(with_quick)  # each in one list
    assert all(Path(test).is_file() for test in ELSEWHERE.values())


# Over this many seconds a --quick run goes to make test-faults (marker bench), which keeps make test
# under 30 minutes; under 5 s it is not even slow.
BENCH_S = 120


def _marks(seconds: int) -> tuple:
    return () if seconds < 5 else (pytest.mark.slow,) if seconds < BENCH_S else (pytest.mark.slow, pytest.mark.bench)


@pytest.mark.parametrize("name", [pytest.param(n, marks=_marks(RUN[n][0])) for n in RUN])
def test_quick_mode_runs(name: str, tmp_path: Path) -> None:
    """Runs to its end and writes its report. Exit 1 is a benchmark's verdict of a goal missed
    (measured on a loaded machine it may be), not a breakage: that one only needs no traceback."""
    done = subprocess.run([sys.executable, str(BENCHMARKS / f"{name}.py"), "--quick", "--out", str(tmp_path)],
                          capture_output=True, text=True, timeout=900)
    output = done.stdout[-3000:] + done.stderr[-5000:]
    assert done.returncode in (0, 1) and "Traceback" not in done.stderr, output
    assert done.returncode == 0 or "MISSED" in done.stdout, output
    assert json.loads((tmp_path / RUN[name][1]).read_text()), output

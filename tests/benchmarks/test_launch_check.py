"""benchmarks/launch_check.py --quick: the launch check of math-1.5b and its 512-GPU point, run as
the benchmark runs it (each a fresh `areal-hpc slurm verify --json`)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path


def test_quick_verifies_both_layouts_and_writes_its_figures(tmp_path: Path) -> None:
    done = subprocess.run([sys.executable, "benchmarks/launch_check.py", "--quick", "--out", str(tmp_path)],
                          capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stdout + done.stderr
    report = json.loads((tmp_path / "launch_check_quick.json").read_text())
    assert (tmp_path / "launch_check_quick.png").stat().st_size > 0
    small, point = report["layouts"]
    assert (small["layout"], point["layout"]) == ("math-1.5b", "math-1.5b@512")
    assert small["ok"] and point["ok"] and report["all_ok"]
    # The 512-GPU point has 4x the ranks but builds the same one shard.
    assert (small["trainers"], point["trainers"]) == (32, 128)
    assert small["shards_built"] == point["shards_built"] == 1
    assert point["group_world"] == 1 + point["engines"] * point["generator_tp"]
    assert 0 < small["trainer_peak_gb"] < small["trainer_limit_gb"]
    assert "math-1.5b" in done.stdout and "512-GPU time" in done.stdout

"""Every shell script passes `bash -n` and shellcheck, the rendered ones included."""

from __future__ import annotations

import subprocess
from pathlib import Path

from areal_hpc.config.load import load_config
from areal_hpc.slurm.render import render

SCRIPTS = sorted(str(p) for p in (Path(__file__).resolve().parents[2] / "slurm").rglob("*.sh"))


def rendered(tmp_path: Path) -> list[str]:
    """Renderings the committed scripts do not cover: the CPU profile, overrides that need quoting."""
    out = []
    for name, config, overrides in [
        ("tiny.sh", "configs/experiments/tiny-cpu.yaml", []),
        ("quoted.sh", "configs/experiments/code-14b.yaml", ["logging.dir=runs/a b", "name=it's"]),
    ]:
        path = tmp_path / name
        path.write_text(render(load_config(config, overrides), config, overrides, script_path=name))
        out.append(str(path))
    return out


def test_scripts_exist() -> None:
    names = {Path(s).name for s in SCRIPTS}
    assert {"train_1p5b.sh", "train_7b.sh", "train_14b_code.sh", "train_32b.sh", "scaling_sweep.sh",
            "start.sh", "stop.sh", "common.sh"} <= names


def test_bash_syntax(tmp_path: Path) -> None:
    for script in SCRIPTS + rendered(tmp_path):
        result = subprocess.run(["bash", "-n", script], capture_output=True, text=True)
        assert result.returncode == 0, f"{script}: {result.stderr}"


def test_shellcheck(shellcheck: str, tmp_path: Path) -> None:
    result = subprocess.run([shellcheck, "-x", "--severity=style", *SCRIPTS, *rendered(tmp_path)],
                            capture_output=True, text=True)
    assert result.returncode == 0, result.stdout + result.stderr

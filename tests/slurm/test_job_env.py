"""The job script's environment and container options, run by bash from a rendered script (no
SLURM needed): MPICH's GPU support off, compile caches on node-local storage, the submit directory
mounted into a pyxis container."""

from __future__ import annotations

import subprocess
from pathlib import Path

from areal_hpc.config.load import load_config
from areal_hpc.slurm.render import render

CONFIG = "configs/experiments/code-32b.yaml"


def _section(script: str, first: str, end: str) -> str:
    """The lines of `script` from the one starting with `first` up to (without) the one starting with `end`."""
    lines = script.splitlines()
    start = next(i for i, line in enumerate(lines) if line.startswith(first))
    stop = next(i for i in range(start, len(lines)) if lines[i].startswith(end))
    return "\n".join(lines[start:stop])


def _run(snippet: str, env: dict[str, str], cwd: Path) -> list[str]:
    """`snippet` under bash with exactly `env` (and PATH); what it prints, a line each."""
    proc = subprocess.run(["bash", "-euo", "pipefail", "-c", snippet], cwd=cwd, env={"PATH": "/usr/bin:/bin", **env},
                          capture_output=True, text=True, check=True)
    return proc.stdout.splitlines()


def _script() -> str:
    return render(load_config(CONFIG), CONFIG, script_path="slurm/train_32b.sh")


def test_job_environment(tmp_path: Path) -> None:
    block = _section(_script(), "# GPU and NCCL settings", "stop_requested=0")
    show = block + "\nenv"
    env = dict(line.split("=", 1) for line in _run(show, {"SLURM_JOB_ID": "77", "TMPDIR": "/local/tmp"}, tmp_path))
    assert env["MPIR_CVAR_ENABLE_GPU"] == "0"
    assert env["VLLM_CACHE_ROOT"] == "/local/tmp/areal-77/vllm"
    assert env["TORCHINDUCTOR_CACHE_DIR"] == "/local/tmp/areal-77/inductor"
    assert env["TRITON_CACHE_DIR"] == "/local/tmp/areal-77/triton"
    # Without TMPDIR, /tmp; a value the user set wins.
    env = dict(line.split("=", 1) for line in _run(show, {"SLURM_JOB_ID": "77", "VLLM_CACHE_ROOT": "/mine",
                                                          "MPIR_CVAR_ENABLE_GPU": "1"}, tmp_path))
    assert env["VLLM_CACHE_ROOT"] == "/mine" and env["TRITON_CACHE_DIR"] == "/tmp/areal-77/triton"
    assert env["MPIR_CVAR_ENABLE_GPU"] == "1"


def test_container_mounts_the_submit_directory(tmp_path: Path) -> None:
    block = _section(_script(), "container_args=()", "read -r -a extra_srun_args") + '\nfor a in "${container_args[@]}"; do echo "$a"; done'
    here = str(tmp_path.resolve())
    image = {"AREAL_CONTAINER_IMAGE": "/images/areal.sqsh", "PWD": here}
    assert _run(block, image, tmp_path) == [
        "--container-image=/images/areal.sqsh", f"--container-workdir={here}", f"--container-mounts={here}:{here}"]
    mounts = _run(block, {**image, "AREAL_CONTAINER_MOUNTS": "/data:/data,/scratch:/scratch:ro"}, tmp_path)
    assert mounts[-1] == f"--container-mounts={here}:{here},/data:/data,/scratch:/scratch:ro"
    # No image: the mounts the user gave, if any, and nothing else.
    assert _run(block, {"AREAL_CONTAINER_MOUNTS": "/data:/data"}, tmp_path) == ["--container-mounts=/data:/data"]
    assert _run(block, {}, tmp_path) == []

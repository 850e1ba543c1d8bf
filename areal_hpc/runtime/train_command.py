"""`areal-hpc train CONFIG [--set KEY=VALUE ...] [--slurm] [--dry-run]`: start a training run.

Locally: every rank of the run under the virtual environment's mpiexec, as many as the config's
world (ExperimentConfig.world_size: 1 controller + tp*pp*dp trainers + the generators), each with
OMP_NUM_THREADS=1; the exit status is the job's. With --slurm: the config's heterogeneous-job
script (`areal-hpc slurm render`), written into logging.dir and submitted with sbatch. The config
is loaded and checked first, so a bad one is refused here (exit 2) rather than on rank 0; a SLURM
job's layout is verified at its true shapes too before it is submitted.
"""

from __future__ import annotations

import argparse
import os
import shlex
import shutil
import subprocess
import sys
from collections.abc import Sequence
from pathlib import Path

from areal_hpc.config.load import load_config
from areal_hpc.config.schema import ExperimentConfig
from areal_hpc.errors import UserError
from areal_hpc.slurm.render import render

# Where --slurm writes the rendered script, under logging.dir.
SCRIPT_NAME = "sbatch.sh"
# Per rank: a rank's intra-op threads would otherwise each take every core of a shared node.
RANK_ENV = {"OMP_NUM_THREADS": "1"}


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser(
        "train", help="run an experiment: its MPI ranks here under mpiexec, or as a SLURM job (--slurm)",
        description="Loads and checks CONFIG, then runs 1 controller + tp*pp*dp trainers + the generators"
                    " as MPI ranks on this machine (python -m areal_hpc.launch under .venv's mpiexec) and exits"
                    " with the job's status; --slurm verifies the layout (areal-hpc slurm verify), writes"
                    " LOGGING_DIR/sbatch.sh and submits it with sbatch instead.")
    p.add_argument("config", metavar="CONFIG", help="experiment YAML, e.g. configs/experiments/quickstart.yaml")
    p.add_argument("--set", dest="overrides", action="append", default=[], metavar="KEY=VALUE",
                   help="dotted override passed to every rank, e.g. --set total_steps=10 (repeatable)")
    p.add_argument("--slurm", action="store_true",
                   help="render the heterogeneous-job script into logging.dir and submit it with sbatch")
    p.add_argument("--dry-run", action="store_true", help="print the command(s) instead of running them")
    p.set_defaults(func=_train)


def mpiexec_path() -> Path:
    """The mpiexec of the MPI that mpi4py was built with: the one beside this Python."""
    return Path(sys.executable).with_name("mpiexec")


def local_command(cfg: ExperimentConfig, config: str, overrides: Sequence[str], mpiexec: Path,
                  python: str) -> list[str]:
    """mpiexec with one rank per place of the config's world, each `python -m areal_hpc.launch`."""
    sets = [arg for o in overrides for arg in ("--set", o)]
    return [str(mpiexec), "-n", str(cfg.world_size), python, "-m", "areal_hpc.launch", config, *sets]


def render_command(config: str, overrides: Sequence[str], script: Path) -> list[str]:
    """The `areal-hpc slurm render` equivalent of what --slurm writes (what --dry-run shows)."""
    return ["areal-hpc", "slurm", "render", config, *[a for o in overrides for a in ("--set", o)], "-o", str(script)]


def script_path(cfg: ExperimentConfig) -> Path:
    return Path(cfg.logging.dir) / SCRIPT_NAME


def shell_line(cmd: Sequence[str], env: dict[str, str] | None = None) -> str:
    prefix = "".join(f"{k}={shlex.quote(v)} " for k, v in (env or {}).items())
    return prefix + shlex.join(cmd)


def exit_status(returncode: int) -> int:
    """A child's status as a shell reports it: 128 + N for one killed by signal N."""
    return 128 - returncode if returncode < 0 else returncode


def check_before_submit(cfg: ExperimentConfig) -> None:
    """What refuses a submission before anything is written: the layout at its true shapes
    (`areal-hpc slurm verify`, memory against AREAL_GPU's preset, default h800), then sbatch."""
    from areal_hpc.metrics.library_logs import quiet_libraries
    from areal_hpc.slurm.verify import gpu_of, verify

    quiet_libraries()  # megatron-core's warnings on building the model
    report = verify(cfg, gpu_of(None), progress=lambda line: print(f"verify: {line}", file=sys.stderr, flush=True))
    if report.problems:
        raise UserError("--slurm: the layout does not verify (areal-hpc slurm verify):\n"
                        + "\n".join(f"  {p}" for p in report.problems))
    if shutil.which("sbatch") is None:
        raise UserError("--slurm: sbatch not found on PATH: submit from a SLURM login node, or train here without --slurm")


def _train(args: argparse.Namespace) -> int:
    cfg = load_config(args.config, args.overrides)
    return (_submit if args.slurm else _run_here)(cfg, args.config, args.overrides, args.dry_run)


def _run_here(cfg: ExperimentConfig, config: str, overrides: list[str], dry_run: bool) -> int:
    mpiexec = mpiexec_path()
    cmd = local_command(cfg, config, overrides, mpiexec, sys.executable)
    if dry_run:
        print(shell_line(cmd, RANK_ENV))
        return 0
    if not os.access(mpiexec, os.X_OK):
        raise UserError(f"no mpiexec at {mpiexec}, beside this Python: install the project's dependencies"
                        " into its environment (make venv), which bring MPICH's")
    proc = subprocess.Popen(cmd, env={**os.environ, **RANK_ENV})
    try:
        return exit_status(proc.wait())
    except KeyboardInterrupt:  # mpiexec got the SIGINT too and ends the ranks: wait for it
        return exit_status(proc.wait())


def _submit(cfg: ExperimentConfig, config: str, overrides: list[str], dry_run: bool) -> int:
    script = script_path(cfg)
    sbatch = ["sbatch", str(script)]
    if dry_run:
        print(shlex.join(render_command(config, overrides, script)))
        print(shlex.join(sbatch))
        return 0
    check_before_submit(cfg)
    script.parent.mkdir(parents=True, exist_ok=True)
    script.write_text(render(cfg, config, overrides, script_path=str(script)))
    script.chmod(0o755)
    print(f"wrote {script}", flush=True)
    return exit_status(subprocess.run(sbatch).returncode)

"""`python -m areal_hpc.launch CONFIG [--set key=value ...]`: the entry point of every MPI rank.

    .venv/bin/mpiexec -n 3 .venv/bin/python -m areal_hpc.launch configs/experiments/tiny-cpu.yaml

Rank 0 becomes the controller, the next tp*pp*dp ranks the trainers, the rest the generators.
Nothing here imports mpi4py or vLLM at import time: vLLM's engine process re-imports this module.
"""

from __future__ import annotations

import argparse
import sys


def mpiexec_surviving_loss(ranks: int) -> list[str]:
    """mpiexec (MPICH's hydra) arguments under which the job outlives a generator killed outright,
    for a job on one machine. -disable-auto-cleanup keeps the other ranks running; but hydra's
    proxy still kills every process it launched once it reaps one that died by a signal (MPICH 5,
    proxy/pmip.c), and one proxy serves all the ranks of a host. So each rank gets a host of its
    own, a loopback address (the fork launcher, no ssh), as each node of a cluster has its own
    proxy; there a lost rank takes its node's other ranks with it, which the controller survives
    as long as they are generators."""
    return ["-disable-auto-cleanup", "-launcher", "fork", "-hosts", ",".join(f"127.0.0.{i + 1}" for i in range(ranks))]


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="python -m areal_hpc.launch", description=__doc__.split("\n")[0])
    p.add_argument("config", nargs="?", help="experiment YAML, e.g. configs/experiments/tiny-cpu.yaml")
    p.add_argument("--join", metavar="RUN_DIR",
                   help="start a replacement generator for the job running in RUN_DIR (its logging.dir), outside"
                        " the MPI world: it takes a lost generator's place (rollout.max_replacements)")
    p.add_argument("--spare", action="store_true",
                   help="with CONFIG: be a warm spare of the run CONFIG describes once its rank 0 is up (its"
                        " logging.dir), as the SLURM scripts start cluster.spare_nodes' spares")
    p.add_argument("--set", dest="overrides", action="append", default=[], metavar="KEY=VALUE",
                   help="dotted override, e.g. --set rollout.eta=0 (repeatable)")
    args = p.parse_args(argv)
    if (args.config is None) == (args.join is None):
        p.error("give either a config (every rank of a job) or --join RUN_DIR (a replacement generator)")
    if args.spare and args.config is None:
        p.error("--spare needs the run's config (and its --set overrides)")
    return args


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    from areal_hpc.runtime.world import run, run_replacement, run_spare

    if args.join:
        return run_replacement(args.join)
    return run_spare(args.config, args.overrides) if args.spare else run(args.config, args.overrides)


if __name__ == "__mp_main__":  # this module, re-imported in a child a rank spawned (vLLM's engine)
    import atexit
    import gc
    import os

    from areal_hpc.runtime.parent_death import die_with_parent
    from areal_hpc.wire.stacks import dump_stacks_on_signal

    die_with_parent()
    dump_stacks_on_signal()
    # The interpreter's last garbage collection would scan the engine's whole heap: seconds on CPU,
    # past vLLM's 5 s shutdown grace, after which the engine was killed. Exit frees it anyway.
    atexit.register(gc.freeze)
    if os.environ.get("VLLM_LOGGING_LEVEL", "ERROR") != "DEBUG":  # the rank's logging.level
        from areal_hpc.metrics.library_logs import quiet_libraries

        quiet_libraries()  # the warning filters of the rank that spawned it are not inherited
elif __name__ == "__main__":
    import gc

    code = main()
    gc.freeze()  # the heap dies with the process: skip the interpreter's last scan of it
    sys.exit(code)

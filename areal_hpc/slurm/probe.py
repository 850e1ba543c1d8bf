"""A small MPI program that checks a heterogeneous SLURM job the way the real run uses it.

The sbatch scripts run it in place of the launcher (AREAL_PROGRAM=areal_hpc.slurm.probe), with the
launcher's arguments: CONFIG [--set KEY=VALUE ...]. Every rank reports where SLURM put it; rank 0
checks that one MPI_COMM_WORLD spans both components, that every rank sits on the component, node
and node-local slot that the rank plan (areal_hpc.wire.layout) gives it, and that rank 0 runs
on the batch node (where the batch script finds it to stop the run before the time limit). Then it
runs `total_steps` steps of AREAL_PROBE_STEP_S seconds under the controller's side of the scripts'
resilience contract: the step count is checkpointed after every step to
<logging.dir>/probe-checkpoint.json and resumed from there, and SIGTERM to rank 0 stops every rank
after the current step. Each run that ends appends one JSON line to <logging.dir>/probe.jsonl.
AREAL_PROBE_CRASH_AT=N makes the first run abort at step N, as a crash does.
Exit status 0, or 2 when a check failed: like the launcher's refusal of a world that does not
match its config, a wrong placement is the job's or the config's fault, which the batch scripts
do not requeue (a requeue would meet it again).
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

from areal_hpc.config.load import load_config
from areal_hpc.config.schema import ExperimentConfig
from areal_hpc.config.validate import check_world
from areal_hpc.errors import UserError
from areal_hpc.slurm.hetjob import placements
from areal_hpc.wire.stacks import dump_stacks_on_signal
from areal_hpc.wire.start_timeout import start_deadline, start_timeout_s

STEP_SECONDS_ENV = "AREAL_PROBE_STEP_S"
# Step at which the first run (restart 0) crashes, as a rank that dies mid-run: MPI_Abort.
CRASH_AT_ENV = "AREAL_PROBE_CRASH_AT"


def hostnames(nodelist: str) -> list[str]:
    """SLURM's compressed node list (node[1-3],gpu07) as names, expanded by SLURM itself."""
    out = subprocess.run(["scontrol", "show", "hostnames", nodelist], capture_output=True, text=True,
                         check=True)
    return out.stdout.split()


def batch_host(job_id: str) -> str:
    """The node that runs the job's batch script (SLURM's BatchHost)."""
    out = subprocess.run(["scontrol", "-o", "show", "job", job_id], capture_output=True, text=True, check=True)
    return out.stdout.split("BatchHost=", 1)[1].split()[0]


def observe(mpi_rank: int) -> dict:
    """Where SLURM placed this task: het component, node index within it, slot on the node."""
    env = os.environ
    try:
        procid = int(env["SLURM_PROCID"])
        first_component_tasks = int(env["SLURM_NTASKS_HET_GROUP_0"])
        component = 0 if procid < first_component_tasks else 1
        nodename = env["SLURMD_NODENAME"]
        nodes = hostnames(env[f"SLURM_JOB_NODELIST_HET_GROUP_{component}"])
        local_id = int(env["SLURM_LOCALID"])
    except KeyError as e:
        raise UserError(f"not a task of a heterogeneous SLURM step (no {e.args[0]}): run it with "
                        "srun --het-group=0,1 inside a het job") from None
    return {"rank": mpi_rank, "slurm_procid": procid, "nodename": nodename, "component": component,
            "node": nodes.index(nodename), "local_id": local_id}


def problems(cfg: ExperimentConfig, observed: list[dict], batch_node: str) -> list[str]:
    """Every way the job's real placement differs from the plan; empty when it matches."""
    found = check_world(cfg, len(observed))
    if found:
        return found
    if {o["component"] for o in observed} != {0, 1}:
        found.append("the MPI world does not span both het components")
    placed = placements(cfg)
    for o, p in zip(observed, placed, strict=True):
        slot = sum(1 for q in placed if (q.component, q.node) == (p.component, p.node) and q.rank < p.rank)
        want = (p.rank, p.component, p.node, slot)
        got = (o["slurm_procid"], o["component"], o["node"], o["local_id"])
        if want != got:
            found.append(f"MPI rank {p.rank} ({p.role.value} {p.index}): SLURM task {got[0]} on component"
                         f" {got[1]} node {got[2]} slot {got[3]}; the plan says task {want[0]} on"
                         f" component {want[1]} node {want[2]} slot {want[3]}")
    if observed[0]["nodename"] != batch_node:
        found.append(f"rank 0 (controller) runs on {observed[0]['nodename']}, not on the batch node"
                     f" {batch_node}: the batch script cannot signal it before the time limit")
    return found


def _read_step(path: Path) -> int:
    return json.loads(path.read_text())["step"] if path.is_file() else 0


def _write_step(path: Path, step: int) -> None:
    tmp = path.with_suffix(".tmp")
    tmp.write_text(json.dumps({"step": step}))
    tmp.replace(path)


class StopRequest:
    """Rank 0's SIGTERM handler: remember the request; the step loop acts on it."""

    def __init__(self) -> None:
        self.requested = False
        signal.signal(signal.SIGTERM, self._note)

    def _note(self, signum: int, frame: object) -> None:
        self.requested = True


def run(cfg: ExperimentConfig) -> int:
    dump_stacks_on_signal()
    # As the launcher: a rank that never starts must not keep the others in MPI_Init or the first
    # collective until the time limit (srun runs with --kill-on-bad-exit=0).
    with start_deadline(start_timeout_s()):
        from mpi4py import MPI  # here, not at import time, as in the launcher

        comm = MPI.COMM_WORLD
        run_dir = Path(cfg.logging.dir)
        if comm.rank == 0:
            request = StopRequest()
            run_dir.mkdir(parents=True, exist_ok=True)
        # A collective over the whole world: rank 0 hears from every rank of both components.
        observed = comm.gather(observe(comm.rank), root=0)
    record: dict = {}
    if comm.rank == 0:
        found = problems(cfg, observed, batch_host(os.environ["SLURM_JOB_ID"]))
        record = {"job_id": os.environ.get("SLURM_JOB_ID"),
                  "restart": int(os.environ.get("SLURM_RESTART_COUNT", "0")), "world_size": comm.size,
                  "problems": found, "ranks": observed}
        for line in found:
            print(f"probe: {line}", flush=True)
    if comm.bcast(bool(record.get("problems")) if comm.rank == 0 else None, root=0):
        if comm.rank == 0:
            _append(run_dir / "probe.jsonl", record)
        return 2

    checkpoint = run_dir / "probe-checkpoint.json"
    step = comm.bcast(_read_step(checkpoint) if comm.rank == 0 else None, root=0)
    record["start_step"] = step
    step_seconds = float(os.environ.get(STEP_SECONDS_ENV, "0"))
    stop = False
    while step < cfg.total_steps and not stop:
        time.sleep(step_seconds)
        comm.Barrier()
        step += 1
        if comm.rank == 0:
            _write_step(checkpoint, step)
            print(f"probe: step {step}/{cfg.total_steps}", flush=True)
            if str(step) == os.environ.get(CRASH_AT_ENV) and record["restart"] == 0:
                print(f"probe: crashing at step {step} ({CRASH_AT_ENV})", flush=True)
                comm.Abort(1)
        stop = comm.bcast(request.requested if comm.rank == 0 else None, root=0)
    if comm.rank == 0:
        record.update(end_step=step, stopped="completed" if step == cfg.total_steps else "stop-request")
        _append(run_dir / "probe.jsonl", record)
        print(f"probe: {record['stopped']} at step {step} (started at {record['start_step']})", flush=True)
    comm.Barrier()
    return 0


def _append(path: Path, record: dict) -> None:
    with path.open("a") as f:
        f.write(json.dumps(record) + "\n")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m areal_hpc.slurm.probe", description=__doc__)
    parser.add_argument("config")
    parser.add_argument("--set", dest="overrides", action="append", default=[], metavar="KEY=VALUE")
    args = parser.parse_args(argv)
    try:
        return run(load_config(args.config, args.overrides))
    except UserError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())

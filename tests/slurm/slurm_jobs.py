"""Jobs on the local SLURM test cluster: submitting rendered scripts, polling, reading results."""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import time
from dataclasses import dataclass
from pathlib import Path

from job_processes import describe, environ

from areal_hpc.config.load import load_config
from areal_hpc.slurm.render import render

REPO = Path(__file__).resolve().parents[2]
LOCAL = REPO / "slurm" / "local"
# What the structural tests run on every rank instead of the launcher (the scripts' default,
# exercised by test_rl_run.py): the probe checks the MPI world and the placement in seconds and
# follows the controller's stop/resume contract with steps of chosen length.
PROGRAM = "areal_hpc.slurm.probe"
# The probe's environment. Its ranks start in seconds, so a rank still in MPI_Init after 60 s
# exits as a crash, which the script requeues, well within a test's wait (the default, 900 s, is
# not). MPICH can hang there under srun --mpi=pmi2, at random: Slurm's plugin takes a PMI-1
# request in one read of 1024 bytes, and the pieces of MPICH's address table that it publishes
# reach 1080 bytes when their padding compresses badly (docs/slurm.md: prefer pmix).
PROBE_ENV = {"AREAL_PROGRAM": PROGRAM, "AREAL_START_TIMEOUT_S": "60"}
TINY = "configs/experiments/tiny-cpu.yaml"
TERMINAL = {"COMPLETED", "FAILED", "CANCELLED", "TIMEOUT", "NODE_FAIL", "OUT_OF_MEMORY", "BOOT_FAIL",
            "DEADLINE", "PREEMPTED"}


def machine_problem() -> str | None:
    """Why this machine cannot run the local cluster or install packages, or None."""
    if os.geteuid() != 0:
        return "needs root (the local SLURM cluster starts daemons and installs Debian packages)"
    if not Path("/etc/debian_version").is_file():
        return "needs Debian (the local SLURM cluster uses Debian's slurm and munge packages)"
    return None


@dataclass
class Cluster:
    """A running local cluster: client commands with its SLURM_CONF, job submission and polling."""

    env: dict[str, str]

    def run(self, *cmd: str, timeout: float = 60, **kw) -> subprocess.CompletedProcess:
        return subprocess.run(cmd, env=kw.pop("env", self.env), capture_output=True, text=True,
                              timeout=timeout, check=True, **kw)

    def sbatch(self, script: Path, *args: str, output: Path, env: dict[str, str] | None = None,
               options: tuple[str, ...] = ()) -> str:
        """Submit as a user does (cwd: repository root): `options` go to sbatch, `args` to the
        script; `env` adds to the environment."""
        out = self.run("sbatch", "--parsable", f"--output={output}", *options, str(script), *args,
                       env={**self.env, **(env or {})}, cwd=REPO)
        return out.stdout.strip().split(";")[0]

    def components(self, job: str) -> list[dict[str, str]]:
        """`scontrol show job` of every het component, as KEY=VALUE dicts."""
        text = self.run("scontrol", "-o", "show", "job", job).stdout
        return [dict(re.findall(r"(\w+)=(\S*)", line)) for line in text.splitlines() if line.strip()]

    def wait(self, job: str, timeout: float = 180) -> list[dict[str, str]]:
        """Poll until every component is finished (a requeued job goes back to pending). A job
        still running at the timeout is stopped (see `stop`), so that it cannot hold the nodes
        that the next tests' jobs wait for, and the error shows where its processes waited."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            comps = self.components(job)
            if all(c["JobState"] in TERMINAL for c in comps):
                return comps
            time.sleep(0.5)
        comps = self.components(job)
        raise AssertionError(f"job {job} not finished after {timeout} s: {[c['JobState'] for c in comps]}\n"
                             f"{self.stop(job)}")

    def unfinished_jobs(self) -> list[str]:
        """Ids of the jobs still pending or running (a heterogeneous job once, by its first id)."""
        out = self.run("squeue", "-h", "-o", "%F").stdout.split()
        return sorted(set(out), key=int)

    def stop(self, job: str) -> str:
        """End a job that outlived its test: its Python processes first print every thread's stack
        into the job's output (SIGUSR2, which the launcher and the probe register), then scancel.
        Returns the job's output for the failure message."""
        comps = self.components(job)
        ids = {c["JobId"] for c in comps}
        pids = job_processes(ids)
        for pid in pids:
            try:
                os.kill(pid, signal.SIGUSR2)
            except ProcessLookupError:
                continue
        if pids:
            time.sleep(2)
        subprocess.run(["scancel", job], env=self.env, capture_output=True, timeout=60)
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline and not all(c["JobState"] in TERMINAL for c in self.components(job)):
            time.sleep(0.5)
        output = Path(comps[0].get("StdOut", ""))
        return f"stopped job {job} (scancel) after its processes printed their stacks:\n{self.explain(output)}"

    def explain(self, output: Path) -> str:
        """A job's output and the end of slurmctld's log, for failure messages."""
        text = output.read_text() if output.is_file() else "(no job output)"
        log = Path(self.env["SLURM_CONF"]).parent / "log" / "slurmctld.log"
        tail = "\n".join(log.read_text().splitlines()[-30:]) if log.is_file() else ""
        return f"job output:\n{text}\nslurmctld log:\n{tail}"


def job_processes(job_ids: set[str]) -> list[int]:
    """The Python processes of a job's steps on this machine (every simulated node is this
    machine), found by SLURM_JOB_ID in their environment; never the batch shell, which SIGUSR2
    would end."""
    found = []
    for proc in Path("/proc").iterdir():
        env = environ(proc) if proc.name.isdigit() else None
        if not env or not any(f"SLURM_JOB_ID={j}".encode() in env for j in job_ids):
            continue
        program = describe([int(proc.name)])[int(proc.name)].split(" ")[0]
        if any(e.startswith(b"SLURM_STEP_ID=") for e in env) and "python" in program:
            found.append(int(proc.name))
    return found


def write_script(tmp_path: Path, config: str, overrides: list[str], named: str | None = None) -> Path:
    """The template behind slurm/train_*.sh, rendered for `config` (named so in the script)."""
    script = tmp_path / "job.sh"
    script.write_text(render(load_config(config, overrides), named or config, overrides, script_path=str(script)))
    script.chmod(0o755)
    return script


def probe_runs(run_dir: Path) -> list[dict]:
    path = run_dir / "probe.jsonl"
    return [json.loads(line) for line in path.read_text().splitlines()] if path.is_file() else []

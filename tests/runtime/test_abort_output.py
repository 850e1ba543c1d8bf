"""Rank 0's last words reach the launcher's output before MPI_Abort takes the job down (real MPI)."""

from __future__ import annotations

import subprocess
import sys
import time

from mpi_jobs import MPIEXEC, job_env

from areal_hpc.runtime.failure import ABORT_DRAIN_S, ABORT_OUTPUT_S

RANK_0_ABORTS = (
    "import time\n"
    "from mpi4py import MPI\n"
    "from areal_hpc.runtime.failure import abort_job\n"
    "comm = MPI.COMM_WORLD\n"
    "if comm.Get_rank() == 0:\n"
    "    time.sleep(1)\n"
    "    abort_job(comm, 'the reason')\n"
    "else:\n"
    "    while True:  # busy, as a trainer or a generator is\n"
    "        pass\n"
)


def test_rank_0_aborts_only_once_the_launcher_has_read_its_last_line():
    """Deterministic: a reader that holds off longer than ABORT_OUTPUT_S still gets the line,
    because abort_job waits until its output pipe is drained (the loss under mpiexec was a race
    between the launcher reading the pipe and the abort)."""
    hold = ABORT_OUTPUT_S + 2.0
    assert hold < ABORT_DRAIN_S
    proc = subprocess.Popen(
        [sys.executable, "-c", "from mpi4py import MPI\nfrom areal_hpc.runtime.failure import abort_job\n"
                               "abort_job(MPI.COMM_WORLD, 'the reason')"],
        env=job_env(), stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True,
    )
    try:
        time.sleep(hold)
        assert proc.poll() is None, "rank 0 aborted before its output was read"
        line = proc.stderr.readline()
        assert line == "error: the reason\n"
        assert proc.wait(timeout=30) != 0
    finally:
        proc.kill()


def test_the_abort_message_reaches_the_output_and_the_job_ends():
    """The same through mpiexec, with busy ranks, as a real job fails."""
    proc = subprocess.run(
        [str(MPIEXEC), "-n", "3", sys.executable, "-c", RANK_0_ABORTS],
        env=job_env(), capture_output=True, text=True, timeout=60,
    )
    assert proc.returncode != 0
    assert "error: the reason" in proc.stdout + proc.stderr, proc.stdout + proc.stderr

"""One job per run directory: a second one is refused with the holder named; a dead holder frees it."""

from __future__ import annotations

import subprocess
import sys

import pytest

from areal_hpc.errors import UserError
from areal_hpc.runtime import run_lock

HOLDER = ("import sys, time\nfrom areal_hpc.runtime import run_lock\n"
          "run_lock.hold(sys.argv[1])\nprint('held', flush=True)\ntime.sleep(60)\n")


def test_a_second_job_is_refused_naming_the_holder_until_it_dies(tmp_path):
    holder = subprocess.Popen([sys.executable, "-c", HOLDER, str(tmp_path)], stdout=subprocess.PIPE, text=True,
                              env={"SLURM_JOB_ID": "4242", "PATH": ""})
    try:
        assert holder.stdout.readline() == "held\n"
        with pytest.raises(UserError, match=r"is in use by SLURM job 4242 \(process \d+ on "):
            run_lock.hold(tmp_path)
    finally:
        holder.kill()
        holder.wait()
    run_lock.hold(tmp_path)  # killed: the kernel released its lock
    assert (tmp_path / run_lock.LOCK_FILE).read_text() == run_lock.holder_id() + "\n"
    run_lock.hold(tmp_path)  # this process holds it already

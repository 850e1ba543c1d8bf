"""Bad launches fail in seconds with a clear message from rank 0, before any process group."""

from __future__ import annotations

import json

import pytest
from mpi_jobs import run_job

# Signs that a worker got as far as building a process group or an engine.
STARTED = ("EngineCore", "megatron", "init_process_group", "trainer rank 0 ready")


def check_refused(job, *fragments: str) -> None:
    assert job.returncode == 2, job.output
    for fragment in fragments:
        assert fragment in job.output, job.output
    assert "Traceback" not in job.output, job.output
    assert not any(s in job.output for s in STARTED), job.output
    assert job.seconds < 60


def test_wrong_world_size():
    job = run_job(2, [], timeout=120)
    check_refused(job, "error: MPI world size 2 does not match the config", "= 3")


def test_missing_model_directory(tmp_path):
    job = run_job(3, [f"model.path={tmp_path}/no-such-model"], timeout=120)
    check_refused(job, "model.path", "directory not found")


@pytest.mark.parametrize("suffix, text, fragment", [
    (".jsonl", '{"prompt": "1+1?", "answer": "2"}\n{"prompt": "2+2?" "answer": "4"}\n', "line 2: not valid JSON"),
    (".jsonl", '{"prompt": "1+1?", "answer": "2"}\n{"question": "x"}\n', "line 2: missing field 'prompt'"),
])
def test_malformed_data_file(tmp_path, suffix, text, fragment):
    data = tmp_path / f"train{suffix}"
    data.write_text(text)
    job = run_job(3, [f"data.train_path={data}"], timeout=120)
    check_refused(job, str(data), fragment)


def test_an_unusable_reference_answer_is_refused_naming_its_row(tmp_path):
    data = tmp_path / "train.jsonl"
    rows = [{"prompt": "1+1?", "answer": "2"}, {"prompt": "cost?", "answer": "\\$18.90"},
            {"prompt": "half?", "answer": "\\frac{1"}]
    data.write_text("".join(json.dumps(r) + "\n" for r in rows))
    job = run_job(3, [f"data.train_path={data}"], timeout=120)
    check_refused(job, str(data), "1 of 3 rows have an unusable reference answer: row 3:", "'\\\\frac{1'")


def test_a_bug_in_the_launch_checks_ends_every_rank():
    """Not bad input but a failure in rank 0's own checks: the other ranks, waiting for the plan,
    are taken down with it instead of waiting forever."""
    job = run_job(3, [], timeout=120, AREAL_HPC_FAULT="controller:0:preflight")
    assert job.returncode not in (0, 2), job.output
    assert "rank 0 (controller) failed before the launch: InjectedFault" in job.output, job.output
    assert job.seconds < 60


def test_workers_give_up_on_a_rank_0_that_never_sends_the_plan():
    """Rank 0 hung before the launch (stalled in its checks): the workers, which have no lifeline
    yet, end themselves after the start timeout with what they waited for, and the job ends."""
    job = run_job(3, [], timeout=120, AREAL_HPC_FAULT="controller:0:preflight:stall", AREAL_START_TIMEOUT_S="4")
    assert job.returncode not in (0, 2), job.output
    assert "no launch plan from rank 0 within 4 s (AREAL_START_TIMEOUT_S)" in job.output, job.output
    assert job.seconds < 60


def test_a_bad_start_timeout_is_refused_by_name():
    job = run_job(3, [], timeout=120, AREAL_START_TIMEOUT_S="soon")
    check_refused(job, "AREAL_START_TIMEOUT_S='soon'")

"""End-to-end runs of the whole system under mpiexec: controller, Megatron trainer, vLLM generator.

One job is killed mid-run (kill -9 of the generator rank) and relaunched; the two together must
look like one uninterrupted run: every step once, every prompt trained exactly once, the
strict staleness bound held in every batch, every version loaded by every generator.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import signal
import subprocess
import time
import uuid
from pathlib import Path

import pytest
from job_processes import MARKER, job_groups, leftovers, rank_pid
from mpi_jobs import job_command, job_env, run_job

from areal_hpc.controller import checkpoint as ck

pytestmark = pytest.mark.slow

ETA, STEPS, B, GROUP = 2, 8, 4, 4


def overrides(run_dir: Path, model_dir: Path, interval: int = 2) -> list[str]:
    return [
        f"logging.dir={run_dir}", f"model.path={model_dir}", f"total_steps={STEPS}",
        f"rollout.eta={ETA}", "rollout.staleness_gate=strict", f"rollout.batch_prompts={B}",
        f"rollout.group_size={GROUP}",
        "rollout.max_concurrent=8", "rollout.max_new_tokens=128", "data.synthetic_eval_size=16",
        f"checkpoint.interval_steps={interval}", "logging.tensorboard=false",
    ]


def read_jsonl(path: Path) -> list[dict]:
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def steps_done(run_dir: Path) -> int:
    path = run_dir / "metrics.jsonl"
    if not path.is_file():
        return 0
    return max((r["step"] for r in read_jsonl(path) if "trained_tokens" in r), default=0)


def wait_for(what: str, done, proc: subprocess.Popen, timeout: float = 420) -> None:
    deadline = time.monotonic() + timeout
    while not done():
        assert proc.poll() is None, f"run 1 ended before {what}:\n" + proc.stdout.read()[-5000:]
        assert time.monotonic() < deadline, f"run 1 did not reach {what}"
        time.sleep(0.3)


@pytest.fixture(scope="module")
def killed_and_resumed(tmp_path_factory, tiny_model_dir):
    """Run 1 (no periodic checkpoints) gets SIGUSR1 at step 2, which asks rank 0 for a checkpoint
    and to go on; after it continued, its generator rank is killed with SIGKILL. Run 2 (periodic
    checkpoints) resumes from that checkpoint and finishes."""
    run_dir = tmp_path_factory.mktemp("e2e")
    checkpoints = run_dir / "checkpoints"
    marker = uuid.uuid4().hex
    proc = subprocess.Popen(
        job_command(3, overrides(run_dir, tiny_model_dir, interval=0)), env=job_env(**{MARKER: marker}),
        stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
    )
    try:
        wait_for("step 2", lambda: steps_done(run_dir) >= 2, proc)
        os.kill(rank_pid(0, marker), signal.SIGUSR1)
        wait_for("its checkpoint", lambda: ck.latest_complete(checkpoints) is not None, proc)
        saved = ck.ControllerState.load(ck.latest_complete(checkpoints)).version
        wait_for("a step after the checkpoint", lambda: steps_done(run_dir) > saved, proc)
        groups = job_groups(marker)
        os.kill(rank_pid(2, marker), signal.SIGKILL)
        killed_at = time.monotonic()
        first_output, _ = proc.communicate(timeout=60)
        exit_s = time.monotonic() - killed_at
    finally:
        if proc.poll() is None:
            proc.kill()
    time.sleep(2)
    orphans = leftovers(marker, groups)
    for pid in orphans:
        os.kill(pid, signal.SIGKILL)
    second = run_job(3, overrides(run_dir, tiny_model_dir), timeout=420)
    return {
        "run_dir": run_dir, "first_rc": proc.returncode, "first_output": first_output, "exit_s": exit_s,
        "orphans": orphans, "saved": saved, "second": second,
    }


def test_killed_rank_ends_the_job_quickly(killed_and_resumed):
    r = killed_and_resumed
    assert r["first_rc"] != 0
    assert r["exit_s"] < 30, r["first_output"][-3000:]
    assert not r["orphans"], f"processes of the killed job were left running: {r['orphans']}"


def test_resume_continues_from_the_last_checkpoint(killed_and_resumed):
    r = killed_and_resumed
    second = r["second"]
    assert second.returncode == 0, second.output[-5000:]
    assert r["saved"] >= 2  # the SIGUSR1 checkpoint
    assert f"checkpoint {r['run_dir'] / 'checkpoints'}" in r["first_output"]
    assert f"resumed from version {r['saved']}" in second.output
    assert "plot: " in second.output


def test_a_checkpoint_truncated_at_any_of_its_files_is_named_and_passed_over(killed_and_resumed, tmp_path, caplog):
    """The newest checkpoint of the real run, each of its files in turn cut to half (the manifest,
    COMPLETE, included): `resume: auto` names the file and resumes from the one before, an explicit
    `checkpoint.resume` of it is refused naming the file, and neither deletes anything."""
    from areal_hpc.config.load import load_config
    from areal_hpc.errors import UserError

    newest = ck.latest_complete(killed_and_resumed["run_dir"] / "checkpoints")
    cfg = load_config("configs/experiments/tiny-cpu.yaml", [f"logging.dir={tmp_path}"])
    older, damaged = ck.step_dir(ck.root_dir(cfg), 1), ck.step_dir(ck.root_dir(cfg), 2)
    shutil.copytree(newest, older)
    shutil.copytree(newest, damaged)
    files = sorted(p for p in damaged.rglob("*") if p.is_file())
    kinds = {p.relative_to(damaged).parts[0] for p in files}
    assert {"trainer", "controller.json", "config.yaml", "tokenizer", ck.MARKER} <= kinds, kinds
    for path in files:
        name = str(path.relative_to(damaged))
        whole = path.read_bytes()
        path.write_bytes(whole[: len(whole) // 2])
        caplog.clear()
        with caplog.at_level("WARNING"):
            assert ck.resume_from(cfg) == older, name
        assert f"checkpoint {damaged} is damaged ({name}: " in caplog.text, caplog.text
        cfg.checkpoint.resume = str(damaged)
        with pytest.raises(UserError, match=f"damaged: {re.escape(name)}: "):
            ck.resume_from(cfg)
        cfg.checkpoint.resume = "auto"
        assert sorted(p for p in damaged.rglob("*") if p.is_file()) == files
        path.write_bytes(whole)
    assert ck.problems(damaged) == []


def test_every_prompt_trained_exactly_once(killed_and_resumed):
    ledger = read_jsonl(killed_and_resumed["run_dir"] / "ledger.jsonl")
    assert [e["step"] for e in ledger] == list(range(STEPS))
    ids = [pid for e in ledger for pid in e["prompt_ids"]]
    assert all(len(e["prompt_ids"]) == B for e in ledger)
    assert sorted(ids) == list(range(STEPS * B))  # none skipped, none twice


def test_versions_staleness_and_weights(killed_and_resumed):
    run_dir = killed_and_resumed["run_dir"]
    steps = [r for r in read_jsonl(run_dir / "metrics.jsonl") if "trained_tokens" in r]
    assert [r["step"] for r in steps] == list(range(1, STEPS + 1))
    assert [r["version"] for r in steps] == list(range(1, STEPS + 1))
    for r in steps:
        assert r["staleness_max"] <= ETA  # oldest token version >= version - eta
        assert sum(v for k, v in r.items() if k.startswith("staleness_hist/")) == B * GROUP
    loaded = read_jsonl(run_dir / "weights.jsonl")
    assert {w["version"] for w in loaded if w["generator_rank"] == 2} == set(range(1, STEPS + 1))
    assert all(w["tensors"] > 0 for w in loaded)
    evals = [r for r in read_jsonl(run_dir / "metrics.jsonl") if "eval_accuracy" in r]
    assert [e["step"] for e in evals] == [0, STEPS]


@pytest.mark.faults
def test_an_exception_on_a_trainer_is_named_by_rank_0_and_ends_the_job(tmp_path, tiny_model_dir):
    """(A generator's exception is survived: tests/runtime/test_generator_loss.py.)"""
    job = run_job(3, overrides(tmp_path, tiny_model_dir), timeout=420, AREAL_HPC_FAULT="trainer:0:step")
    assert job.returncode != 0
    assert "error: rank 1 (trainer 0) failed: InjectedFault" in job.output, job.output[-5000:]


@pytest.mark.faults
@pytest.mark.parametrize("fault, setting, named", [
    ("trainer:0:step:stall", "watchdog.train_step_s=8",
     "error: hung: the trainer: training step for version 0 has taken"),
    ("generator:0:request:stall", "watchdog.generation_s=8",
     "error: hung: rank 2 (generator 0): generating (no sample came back) for its prompts in flight"),
])
def test_a_hung_rank_is_named_within_its_deadline(tmp_path, tiny_model_dir, fault, setting, named):
    """A rank that stops without dying is seen by the watchdog, not left to the job's time limit."""
    job = run_job(3, [*overrides(tmp_path, tiny_model_dir), setting], timeout=420, AREAL_HPC_FAULT=fault)
    assert job.returncode != 0
    assert named in job.output, job.output[-5000:]
    assert "past its deadline of 8 s" in job.output


def test_sim_fit_on_this_run_then_predict_with_it(killed_and_resumed, tmp_path, capsys):
    """`areal-hpc sim fit` on the run directory of this real job (both its runs), then the
    simulator's commands accept the calibration it wrote."""
    from areal_hpc.cli import main
    from areal_hpc.sim.commands import read_calibration

    run_dir = killed_and_resumed["run_dir"]
    steps = [r for r in read_jsonl(run_dir / "metrics.jsonl") if "trained_tokens" in r]
    assert any(k.startswith("gen/decode/b") for r in steps for k in r), "no engine step times recorded"
    assert all("response_len_log_within_std" in r and "reward_s_mean" in r for r in steps)
    out = tmp_path / "calibration.yaml"
    assert main(["sim", "fit", str(run_dir), "--out", str(out)]) == 0
    cal = read_calibration(out)
    assert cal.hardware == "cpu"
    for name in ("step_overhead_s", "train_mfu", "update_overhead_s", "reward_s", "length_median"):
        assert getattr(cal, name).points > 0, name
    capsys.readouterr()
    model = "configs/experiments/tiny-cpu.yaml"
    assert main(["sim", "scaling", "--model", model, "--context", "384", "--gpus", "2,3",
                 "--calibration", str(out), "--json", "--quick"]) == 0
    rows = json.loads(capsys.readouterr().out)
    assert [r["gpus"] for r in rows] == [2, 3] and all(r["tokens_per_s"] > 0 for r in rows)
    assert main(["sim", "staleness", "--model", model, "--gpus", "2", "--etas", "0,2",
                 "--calibration", str(out), "--json", "--quick"]) == 0
    assert len(json.loads(capsys.readouterr().out)) == 2

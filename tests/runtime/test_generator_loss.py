"""A generator killed mid-run (SIGKILL, as the out-of-memory killer kills) under mpiexec with one
proxy per rank and -disable-auto-cleanup (launch.mpiexec_surviving_loss): the run goes on with the
other one and trains every step, every prompt exactly once, and says so."""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import time
import uuid
from pathlib import Path

import pytest
from job_processes import MARKER, environ, job_pids
from mpi_jobs import job_command, job_env, run_job

from areal_hpc.launch import mpiexec_surviving_loss

pytestmark = [pytest.mark.slow, pytest.mark.faults]

STEPS, B, GROUP = 6, 4, 4
# Generator 1 (rank 3) dies as the update to version 2 reaches it, with prompts in flight: the
# trainer's send breaks, and so does generator 0's receive; both go on.
FAULT = "generator:1:update@2:kill"


def read_jsonl(path: Path) -> list[dict]:
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def assert_trained_once_with(generators: int, run_dir: Path, out: str) -> None:
    """Every step trained, the last with `generators` left, and every prompt trained once."""
    steps = [r for r in read_jsonl(run_dir / "metrics.jsonl") if "trained_tokens" in r]
    assert [r["step"] for r in steps] == list(range(1, STEPS + 1)), out[-5000:]
    assert steps[-1]["generators_alive"] == generators
    ids = [pid for e in read_jsonl(run_dir / "ledger.jsonl") for pid in e["prompt_ids"]]
    assert len(ids) == len(set(ids)) == STEPS * B


def run_with(fault: str, run_dir: Path, model_dir: Path, *settings: str, generators: int = 2):
    overrides = [*settings,
        f"logging.dir={run_dir}", f"model.path={model_dir}", f"total_steps={STEPS}", f"generator.count={generators}",
        f"cluster.rollout_nodes={generators}", "rollout.eta=2", f"rollout.batch_prompts={B}",
        f"rollout.group_size={GROUP}", "rollout.max_concurrent=8", "rollout.max_new_tokens=64",
        "data.synthetic_eval_size=4", "eval.n=2", "checkpoint.interval_steps=0", "logging.tensorboard=false",
    ]
    ranks = 2 + generators
    return run_job(ranks, overrides, timeout=480, mpiexec_args=tuple(mpiexec_surviving_loss(ranks)),
                   AREAL_HPC_FAULT=fault)


@pytest.fixture(scope="module")
def lost_run(tmp_path_factory, tiny_model_dir):
    run_dir = tmp_path_factory.mktemp("generator_loss")
    return run_with(FAULT, run_dir, tiny_model_dir), run_dir


def test_the_run_goes_on_without_the_lost_generator_and_says_so(lost_run):
    job, run_dir = lost_run
    assert "rank 3 (generator 1) died without reporting an error" in job.output, job.output[-5000:]
    assert "going on without it" in job.output and "1 of 2 generators left" in job.output
    assert "stage 0: sending version 2 failed" in job.output and "new weight group of generator ranks 2" in job.output
    steps = [r for r in read_jsonl(run_dir / "metrics.jsonl") if "trained_tokens" in r]
    assert [r["step"] for r in steps] == list(range(1, STEPS + 1)), job.output[-5000:]
    alive = [r["generators_alive"] for r in steps]
    assert alive[-1] == 1 and alive == sorted(alive, reverse=True)
    summary = json.loads((run_dir / "summary.json").read_text())
    assert (summary["generators_first"], summary["generators_last"]) == (2, 1)
    evals = [r for r in read_jsonl(run_dir / "metrics.jsonl") if "eval_accuracy" in r]
    assert [e["step"] for e in evals] == [0, STEPS]
    # Rank 0 ended normally; hydra's exit status also carries the killed rank's.
    assert f"metrics: {run_dir / 'metrics.jsonl'}" in job.output


def test_every_prompt_is_trained_exactly_once_after_the_loss(lost_run):
    _, run_dir = lost_run
    ledger = read_jsonl(run_dir / "ledger.jsonl")
    assert [e["step"] for e in ledger] == list(range(STEPS))
    ids = [pid for e in ledger for pid in e["prompt_ids"]]
    assert all(len(e["prompt_ids"]) == B for e in ledger)
    assert len(ids) == len(set(ids)) == STEPS * B


def test_the_weight_groups_are_rebuilt_without_the_lost_generator(lost_run):
    _, run_dir = lost_run
    loaded = read_jsonl(run_dir / "weights.jsonl")
    by_version: dict[int, set[int]] = {}
    for w in loaded:
        by_version.setdefault(w["version"], set()).add(w["generator_rank"])
    assert by_version[1] == {2, 3}
    # The broken update of version 2 was left to the next step's, in a group of the survivor
    # alone, whose checksums matched every version after.
    assert set(by_version) >= set(range(3, STEPS + 1))
    assert all(by_version[v] == {2} for v in by_version if v > 1)


def test_a_generator_that_fails_is_dropped_and_the_run_goes_on(tmp_path, tiny_model_dir):
    """An exception on generator 1 mid-run: it reports before its clean-up, rank 0 names it, cuts
    its lifeline, and trains every step with generator 0."""
    job = run_with("generator:1:request@8", tmp_path, tiny_model_dir)
    assert "rank 3 (generator 1) failed: InjectedFault" in job.output, job.output[-5000:]
    assert "going on without it" in job.output, job.output[-5000:]
    # Its process is ended by rank 0's cut, not left to its own clean-up, which can hang while
    # its weight-group sockets hold a transfer.
    assert "rank 3: rank 0 dropped this rank from the run" in job.output, job.output[-5000:]
    assert not [line for line in job.output.splitlines() if line.startswith("error: ")]
    steps = [r for r in read_jsonl(tmp_path / "metrics.jsonl") if "trained_tokens" in r]
    assert [r["step"] for r in steps] == list(range(1, STEPS + 1))
    assert steps[-1]["generators_alive"] == 1


def test_a_generator_hung_in_an_update_is_cut_loose_and_the_run_goes_on(tmp_path, tiny_model_dir):
    """Generator 1 stops (without dying) as the update to version 2 reaches it: past its deadline
    rank 0 drops it, its process leaves on rank 0's word, and generator 0, which took the update
    up and waited on it, is kept and loads the update again without it."""
    job = run_with("generator:1:update@2:stall", tmp_path, tiny_model_dir, "watchdog.weight_update_s=10")
    out = job.output
    assert "hung: rank 3 (generator 1): loading the weights of version 2 has taken" in out, out[-5000:]
    assert "going on without it" in out and "1 of 2 generators left" in out, out[-5000:]
    assert "rank 3: rank 0 dropped this rank from the run (it hung" in out
    assert "rank 2 (generator 0)" not in out.split("hung: rank 3")[1].split("\n")[0]
    assert_trained_once_with(1, tmp_path, out)


def test_a_generator_hung_at_a_request_is_dropped_though_updates_reach_it(tmp_path, tiny_model_dir):
    """Generator 1's main loop stops at its third request, with prompts in flight, and never takes
    up the updates that follow. Rank 0 names it by its generation deadline (which an update's
    clock used to replace, and the first update's is `first_s`, an hour) or, when the trainer is
    past its own deadline while stuck sending to it, blames it rather than the trainer (which
    used to end the job: seen in the chaos campaign). The run goes on with generator 0."""
    job = run_with("generator:1:request@3:stall", tmp_path, tiny_model_dir, "watchdog.generation_s=20",
                   "watchdog.train_step_s=20")
    out = job.output
    assert re.search(r"hung: rank 3 \(generator 1\)(: generating|: never took up the weight update)", out), out[-5000:]
    assert "rank 3: rank 0 dropped this rank from the run (it hung" in out, out[-5000:]
    assert not [line for line in out.splitlines() if line.startswith("error: ")], out[-5000:]
    assert_trained_once_with(1, tmp_path, out)


def test_a_failed_and_a_hung_generator_are_dropped_and_the_run_goes_on(tmp_path, tiny_model_dir):
    """Three generators. Generator 1 raises mid-run: it reports before its clean-up, rank 0 names
    it and cuts its lifeline, which ends its process (its own clean-up can hang while its
    weight-group sockets hold a transfer). Generator 2 stops, without dying, in its third weight
    update (or is stranded in one that generator 1's loss broke): past its deadline rank 0 drops
    it and its process leaves on rank 0's word, while generator 0, which took the update up and
    waited on it, is kept and loads the update again without it. Every step is trained, every
    prompt once."""
    job = run_with("generator:1:request@4,generator:2:update@3:stall", tmp_path, tiny_model_dir,
                   "watchdog.weight_update_s=10", generators=3)
    out = job.output
    assert "rank 3 (generator 1) failed: InjectedFault" in out, out[-5000:]
    assert "rank 3: rank 0 dropped this rank from the run" in out, out[-5000:]
    hung = re.search(r"hung: rank 4 \(generator 2\): loading the weights of version \d+ has taken.*", out)
    assert hung and "rank 2 (generator 0)" not in hung[0], out[-5000:]
    assert "rank 4: rank 0 dropped this rank from the run (it hung" in out, out[-5000:]
    assert out.count("going on without it") == 2 and "1 of 3 generators left" in out, out[-5000:]
    assert not [line for line in out.splitlines() if line.startswith("error: ")], out[-5000:]
    assert_trained_once_with(1, tmp_path, out)


SERVED = re.compile(r"rank 3 \(generator 1\) \(a replacement\) serves version (\d+): 2 of 2 generators")
FIRST = re.compile(r"rank 3 \(generator 1\) \(a replacement\) sent its first trajectory")


def rank_pid(marker: str, rank: int) -> int | None:
    """The process of MPI rank `rank` of the job (the leader of its process group)."""
    for pid in job_pids(marker):
        env = environ(Path(f"/proc/{pid}")) or []
        try:
            if f"PMI_RANK={rank}".encode() in env and os.getpgid(pid) == pid:
                return pid
        except ProcessLookupError:
            continue
    return None


def wait_for(what: str, done, seconds: float, proc: subprocess.Popen, output: Path) -> None:
    deadline = time.monotonic() + seconds
    while not done():
        if proc.poll() is not None or time.monotonic() > deadline:
            raise AssertionError(f"never happened: {what}; the job's output ended:\n{output.read_text()[-5000:]}")
        time.sleep(0.2)


def test_a_spare_joins_the_running_job_in_a_lost_generators_place(tmp_path, tiny_model_dir):
    """A spare started beside the job (`python -m areal_hpc.launch --join RUN_DIR`, outside the
    MPI world: it reaches rank 0 through RUN_DIR/join.json) starts its engine; then generator 1
    (rank 3) is killed. The spare takes rank 3's place, joins the next weight update, is verified
    to serve the current version, then generates. Every step trains, every prompt once; the run
    is stopped with SIGTERM (checkpoint and stop) once the replacement served a few steps."""
    marker = uuid.uuid4().hex
    run_dir = tmp_path / "run"
    overrides = [f"logging.dir={run_dir}", f"model.path={tiny_model_dir}", "total_steps=1000", "generator.count=2",
                 "cluster.rollout_nodes=2", "rollout.eta=2", f"rollout.batch_prompts={B}", f"rollout.group_size={GROUP}",
                 "rollout.max_concurrent=8", "rollout.max_new_tokens=64", "data.synthetic_eval_size=4", "eval.n=2",
                 "checkpoint.interval_steps=0", "logging.tensorboard=false"]
    env = job_env(**{MARKER: marker})
    log, output = tmp_path / "spare.log", tmp_path / "job.log"
    metrics = run_dir / "metrics.jsonl"
    with log.open("w") as spare_out, output.open("w") as job_out:
        job = subprocess.Popen(job_command(4, overrides, mpiexec_args=tuple(mpiexec_surviving_loss(4))), env=env,
                               stdout=job_out, stderr=subprocess.STDOUT)
        try:
            wait_for("the job's first record", metrics.exists, 300, job, output)
            assert (run_dir / "join.json").stat().st_mode & 0o777 == 0o600  # it holds the job's secret
            spare = subprocess.Popen([sys.executable, "-m", "areal_hpc.launch", "--join", str(run_dir)], env=env,
                                     stdout=spare_out, stderr=subprocess.STDOUT)
            # Beside the running job on 2 cores a vLLM engine takes minutes to start (24 s alone).
            wait_for("the spare's engine", lambda: "spare ready" in log.read_text(), 900, job, output)
            os.kill(rank_pid(marker, 3), signal.SIGKILL)

            def trained() -> int:
                return max((r["step"] for r in read_jsonl(metrics) if "trained_tokens" in r), default=0)
            # The tiny model's steps take about a second: count steps from the replacement's first
            # trajectory, not from the version it first served.
            wait_for("the replacement's first trajectory", lambda: FIRST.search(output.read_text()), 300, job, output)
            first_at = trained()
            wait_for("2 steps after the replacement's first trajectory", lambda: trained() >= first_at + 2, 300, job,
                     output)
            os.kill(rank_pid(marker, 0), signal.SIGTERM)
            job.wait(timeout=300)
            spare.wait(timeout=60)
        finally:
            for pid in job_pids(marker):
                os.kill(pid, signal.SIGKILL)
    out, joined = output.read_text(), log.read_text()
    assert "rank 3 (generator 1) died without reporting an error" in out, out[-5000:]
    assert "a replacement takes the place of rank 3 (generator 1)" in out, out[-5000:] + joined[-3000:]
    assert "rank 3 (generator 1) (a replacement) is ready" in out, out[-5000:] + joined[-3000:]
    served = SERVED.search(out)
    assert served, out[-5000:] + joined[-3000:]
    samples = re.search(r"rank 3 \(replacement\): (\d+)", out)
    assert samples and int(samples[1]) > 0, out[-3000:]
    # Rank 0 ended normally; hydra's exit status also carries the killed rank's.
    assert "stopped on request" in out and f"metrics: {metrics}" in out, out[-3000:]
    assert spare.returncode == 0 and "[rank 3 generator 1]" in joined, joined[-3000:]
    steps = [r for r in read_jsonl(metrics) if "trained_tokens" in r]
    last = len(steps)
    assert [r["step"] for r in steps] == list(range(1, last + 1)), out[-5000:]
    # A warm spare serves within the step of the loss: each step's record may count 2.
    assert steps[-1]["generators_alive"] == 2
    lost_at = int(re.search(r"lost rank 3 \(generator 1\) at version (\d+)", out)[1])
    assert lost_at <= int(served[1]) <= lost_at + 1, out[-5000:]
    weights = read_jsonl(run_dir / "weights.jsonl")
    assert {w["version"] for w in weights if w["generator_rank"] == 3} >= {int(served[1]), last}
    ids = [pid for e in read_jsonl(run_dir / "ledger.jsonl") for pid in e["prompt_ids"]]
    assert len(ids) == len(set(ids)) == last * B
    assert not (run_dir / "join.json").exists()

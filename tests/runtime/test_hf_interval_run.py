"""checkpoint.hf_interval in a real run (controller, trainer, vLLM generator under mpiexec): the
checkpoints of its steps and of the last version hold hf/, in their manifest, that vLLM and
transformers load as they are, and `areal-hpc export-hf` of the same checkpoint writes the same
tensors."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest
import torch
from mpi_jobs import run_job

from areal_hpc.cli import main
from areal_hpc.controller import checkpoint as ck
from areal_hpc.trainer.hf_checkpoint import HFCheckpoint

pytestmark = pytest.mark.slow

STEPS = 3
PROMPT = [5, 17, 33, 2, 9, 41]
# Greedy tokens of PROMPT from a fresh in-process vLLM engine on the directory given as argv[1].
VLLM_GREEDY = """
import json, sys
from vllm import LLM, SamplingParams
from vllm.inputs import TokensPrompt
llm = LLM(model=sys.argv[1], dtype="float32", kv_cache_memory_bytes=64 * 2**20, enforce_eager=True,
          distributed_executor_backend="uni")
out = llm.generate([TokensPrompt(prompt_token_ids=json.loads(sys.argv[2]))],
                   SamplingParams(max_tokens=12, temperature=0.0, ignore_eos=True))
print("TOKENS", json.dumps(list(out[0].outputs[0].token_ids)))
"""


@pytest.fixture(scope="module")
def run(tmp_path_factory, tiny_model_dir):
    run_dir = tmp_path_factory.mktemp("hf-interval")
    job = run_job(3, [
        f"logging.dir={run_dir}", f"model.path={tiny_model_dir}", f"total_steps={STEPS}", "rollout.eta=1",
        "rollout.batch_prompts=4", "rollout.group_size=2", "rollout.max_new_tokens=32",
        "data.synthetic_eval_size=4", "checkpoint.interval_steps=1", "checkpoint.hf_interval=2",
        "checkpoint.keep_last=3", "logging.tensorboard=false",
    ], timeout=600)
    assert job.returncode == 0, job.output[-5000:]
    return run_dir / "checkpoints"


def test_exports_at_hf_interval_steps_and_the_last_version_inside_the_manifest(run):
    steps = {v: ck.step_dir(run, v) for v in range(1, STEPS + 1)}
    assert all(ck.is_complete(p) for p in steps.values())
    assert [v for v, p in steps.items() if ck.hf_dir(p).is_dir()] == [2, 3]
    for v in (2, 3):
        listed = json.loads((steps[v] / ck.MARKER).read_text())["files"]
        assert {"hf/config.json", "hf/generation_config.json", "hf/model.safetensors.index.json",
                "hf/tokenizer.json", "config.yaml", "tokenizer/tokenizer.json"} <= set(listed)
        assert ck.problems(steps[v]) == []


def test_vllm_and_transformers_load_the_last_export_and_agree(run):
    from transformers import AutoModelForCausalLM

    hf = ck.hf_dir(ck.step_dir(run, STEPS))
    env = dict(os.environ, VLLM_ENABLE_V1_MULTIPROCESSING="0", OMP_NUM_THREADS="1", VLLM_LOGGING_LEVEL="WARNING")
    proc = subprocess.run([sys.executable, "-c", VLLM_GREEDY, str(hf), json.dumps(PROMPT)], env=env,
                          capture_output=True, text=True, timeout=300)
    line = next((x for x in proc.stdout.splitlines() if x.startswith("TOKENS ")), None)
    assert line is not None, proc.stderr[-4000:]
    vllm_tokens = json.loads(line.removeprefix("TOKENS "))
    model = AutoModelForCausalLM.from_pretrained(str(hf), dtype=torch.float32).eval()
    with torch.no_grad():
        ids = model.generate(torch.tensor([PROMPT]), max_new_tokens=12, min_new_tokens=12, do_sample=False)
    assert vllm_tokens == ids[0, len(PROMPT):].tolist()


def test_export_hf_of_the_checkpoint_writes_the_runs_tensors(run, tmp_path):
    step = ck.step_dir(run, STEPS)
    assert main(["export-hf", str(step), "--out", str(tmp_path / "out")]) == 0
    mine, theirs = HFCheckpoint(tmp_path / "out"), HFCheckpoint(ck.hf_dir(step))
    assert mine.names() == theirs.names()
    for name in theirs.names():
        assert torch.equal(mine.get(name), theirs.get(name)), name

"""A whole run on data as verl users bring it: a parquet of chat-message prompts, rendered by the
chat template in the model directory's tokenizer files, with math ground truths, through the real
launch (controller, Megatron trainer, vLLM generator under mpiexec)."""

from __future__ import annotations

import json
import random
import shutil
from pathlib import Path

import pytest
from chat_data import verl_row, write_verl
from mpi_jobs import run_job
from warm_model import warm_model_dir

from areal_hpc.data.arithmetic import make_problem

pytestmark = pytest.mark.slow

STEPS, B, GROUP, MAX_PROMPT = 2, 4, 4, 48
# Renders a user message as the synthetic task's prompt ("Q: 3+4 = ?\nA:"), which the warm-started
# tiny model answers, so some samples are right only if the template reached the model.
TEMPLATE = ("{% for m in messages %}{% if m['role'] == 'system' %}{{ m['content'] }}\n{% else %}"
            "{{ m['content'] }}{% endif %}{% endfor %}{% if add_generation_prompt %}\nA:{% endif %}")


@pytest.fixture(scope="module")
def chat_model_dir(tmp_path_factory) -> Path:
    """The warm-started tiny model (cached per machine), its tokenizer given TEMPLATE."""
    from transformers import AutoTokenizer

    out = tmp_path_factory.mktemp("chat-model") / "model"
    shutil.copytree(warm_model_dir(), out)
    tok = AutoTokenizer.from_pretrained(str(out))
    tok.chat_template = TEMPLATE
    tok.save_pretrained(str(out))
    return out


def verl_rows(rng: random.Random, n: int, start: int) -> list[dict]:
    """One-operation problems (the warm start's easiest), every other one with a system message."""
    rows = []
    for i in range(start, start + n):
        p = make_problem(rng, n_ops=1)
        rows.append(verl_row(i, p.prompt.removesuffix("\nA:"), p.answer, system=i % 2 == 1))
    return rows


def read_jsonl(path: Path) -> list[dict]:
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def test_a_run_on_verl_parquet_with_a_chat_template(tmp_path: Path, chat_model_dir: Path) -> None:
    from transformers import AutoTokenizer

    rng = random.Random(5)
    long_row = verl_row(STEPS * B, "Q: " + "".join(f"{rng.randint(1, 9)}{rng.choice('+-*')}" for _ in range(150))
                        + "1 = ?", "0")
    tok = AutoTokenizer.from_pretrained(str(chat_model_dir))
    rendered = tok.apply_chat_template(long_row["prompt"], tokenize=False, add_generation_prompt=True)
    assert len(tok(rendered, add_special_tokens=False)["input_ids"]) > MAX_PROMPT
    write_verl(tmp_path / "train.parquet", verl_rows(rng, STEPS * B, 0) + [long_row])
    write_verl(tmp_path / "eval.parquet", verl_rows(rng, 8, 100))
    write_verl(tmp_path / "eval2.parquet", verl_rows(rng, 4, 200))
    run_dir = tmp_path / "run"
    job = run_job(3, [
        f"logging.dir={run_dir}", f"model.path={chat_model_dir}", f"total_steps={STEPS}", "rollout.eta=0",
        f"rollout.batch_prompts={B}", f"rollout.group_size={GROUP}", "rollout.max_concurrent=4",
        f"rollout.max_prompt_len={MAX_PROMPT}", "rollout.max_new_tokens=64", "data.layout=verl",
        "data.shuffle=false", f"data.train_path={tmp_path / 'train.parquet'}",
        f"eval.paths=[{tmp_path / 'eval.parquet'},{tmp_path / 'eval2.parquet'}]", "eval.n=2",
        "eval.temperature=0.6", "eval.top_p=0.95", "reward.math_fallbacks=[]",
        "checkpoint.interval_steps=0", "logging.tensorboard=false",
    ], timeout=600)
    assert job.returncode == 0, job.output[-5000:]
    assert (f"rank 0 (controller): train.parquet: {STEPS * B + 1} rows, 1 left out: longer than"
            f" rollout.max_prompt_len = {MAX_PROMPT} (rows {STEPS * B + 1})") in job.output
    records = read_jsonl(run_dir / "metrics.jsonl")
    steps = [r for r in records if "trained_tokens" in r]
    assert [r["step"] for r in steps] == [1, 2]
    assert all("source/openai/gsm8k/reward_mean" in r for r in steps)
    evals = read_jsonl(run_dir / "eval" / f"version-{STEPS:06d}.jsonl")
    by_row = {e["row"]: e for e in evals}
    assert sorted(by_row) == list(range(12))  # both held-out sets, the messages as the data gave them
    assert all(len(e["rewards"]) == 2 for e in evals)  # eval.n samples each, not group_size
    final = [r for r in records if "eval_accuracy" in r][-1]
    assert {"eval_set/eval/accuracy", "eval_set/eval2/accuracy", "eval_set/eval/pass@2", "eval_pass@2"} <= set(final)
    assert [m["role"] for m in by_row[1]["prompt"]] == ["system", "user"] and by_row[0]["prompt"][0]["role"] == "user"
    rewards = [r["reward_mean"] for r in steps] + [x for e in evals for x in e["rewards"]]
    assert max(rewards) > -5.0, "no sample was ever right: the chat template did not give the model its prompt"

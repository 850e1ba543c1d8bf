"""The synthetic code task: its hidden tests agree with its examples, a program of the function
passes them in the real sandbox, and one that replays the examples does not."""

from __future__ import annotations

import json
import random
import re

import pytest

from areal_hpc.config.load import load_config
from areal_hpc.config.schema import CodeSandboxConfig, RewardConfig
from areal_hpc.data.program_task import make_splits, with_slip
from areal_hpc.data.prompts import train_and_eval_prompts
from areal_hpc.data.tiny_model import build_tiny_model
from areal_hpc.recipes.warm_start import cache_dir
from areal_hpc.reward.code_check import check_code
from areal_hpc.reward.code_tests import parse_tests
from areal_hpc.reward.sandbox import BACKENDS, Sandbox, SandboxUnavailable
from areal_hpc.reward.task import CodeTask

CONFIG = "configs/experiments/quickstart-code.yaml"
EXAMPLE = re.compile(r"f\((-?\d+)\)=(-?\d+)")
REWARD = RewardConfig(kind="code")


@pytest.fixture(scope="module")
def sandbox() -> Sandbox:
    """The strongest sandbox backend this machine has (bwrap where installed)."""
    for backend in BACKENDS:
        try:
            return Sandbox.detect(CodeSandboxConfig(backend=backend))
        except SandboxUnavailable:
            continue
    pytest.skip("no sandbox backend works here")


def examples(prompt: str) -> list[tuple[int, int]]:
    return [(int(x), int(y)) for x, y in EXAMPLE.findall(prompt)]


def fitted_program(prompt: str) -> str:
    """The line through the first two examples, written independently of the task's solution."""
    (x0, y0), (x1, y1) = examples(prompt)[:2]
    a = (y1 - y0) // (x1 - x0)
    return f"```python\nx = int(input())\nprint({a} * x + ({y0 - a * x0}))\n```"


def passes(program: str, answer: str, sandbox: Sandbox) -> bool:
    return check_code(CodeTask(program, parse_tests(json.loads(answer))), REWARD, sandbox).reward >= REWARD.correct


def test_the_examples_lie_on_a_line_and_the_hidden_inputs_are_new() -> None:
    _, problems = make_splits(0, 0, 200)
    for p in problems:
        shown = examples(p.prompt)
        (x0, y0), (x1, y1) = shown[:2]
        a = (y1 - y0) // (x1 - x0)
        assert all(y == a * x + y0 - a * x0 for x, y in shown), p.prompt
        tests = json.loads(p.answer)
        assert not {int(x) for x in tests["inputs"]} & {x for x, _ in shown}
        assert len(tests["inputs"]) == len(tests["outputs"]) >= 3


def test_a_program_of_the_function_passes_and_replaying_the_examples_fails(sandbox: Sandbox) -> None:
    _, problems = make_splits(1, 0, 12)
    for p in problems:
        assert passes(p.solution, p.answer, sandbox), p.solution
        assert passes(fitted_program(p.prompt), p.answer, sandbox)
        table = dict(examples(p.prompt))
        assert not passes(f"```python\nx = int(input())\nprint({table}.get(x, {table[min(table)]}))\n```",
                          p.answer, sandbox)
        a, b = map(int, re.search(r"print\((-?\d+)\*x([+-]\d+)\)", p.solution).groups())
        assert not passes(f"```python\nx = int(input())\nprint({a}*x+{b + 1})\n```", p.answer, sandbox)


def test_a_slipped_program_is_one_coefficient_off_and_fails_the_tests(sandbox: Sandbox) -> None:
    _, problems = make_splits(2, 0, 8)
    rng = random.Random(0)
    for p in problems:
        slipped = with_slip(p, rng)
        assert (slipped.prompt, slipped.answer) == (p.prompt, p.answer)
        right, wrong = (re.search(r"print\((-?\d+)\*x([+-]\d+)\)", q.solution).groups() for q in (p, slipped))
        assert sorted(abs(int(x) - int(y)) for x, y in zip(right, wrong, strict=True)) == [0, 1]
        assert not passes(slipped.solution, p.answer, sandbox)


def test_held_out_sets_are_prefixes_and_never_trained_on() -> None:
    train, held_out = make_splits(3, 2000, 64)
    assert [p.prompt for p in make_splits(3, 0, 16)[1]] == [p.prompt for p in held_out[:16]]
    assert not {p.prompt for p in train} & {p.prompt for p in held_out}
    assert len({p.prompt for p in held_out}) == 64


def test_the_config_selects_the_task_for_the_run_and_the_tokenizer(tmp_path) -> None:
    cfg = load_config(CONFIG, ["data.synthetic_train_size=50", "data.synthetic_eval_size=10"])
    train, [(name, held_out)] = train_and_eval_prompts(cfg.data, cfg.seed)
    assert name == "synthetic" and len(train) == 50 and len(held_out) == 10
    assert all(parse_tests(json.loads(r.answer)).kind == "stdio" for r in train + held_out)
    assert all(len(examples(r.prompt)) == 3 for r in train)

    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(str(build_tiny_model(cfg.model, tmp_path / "m", task="programs")))
    solution = make_splits(0, 1, 1)[0][0].solution
    # A tokenizer trained on the programs merges their boilerplate: far fewer tokens than bytes.
    assert len(tok(solution)["input_ids"]) < len(solution) / 2


def test_the_warm_started_model_of_the_task_is_cached_apart() -> None:
    tiny = load_config("configs/experiments/tiny-cpu.yaml")
    programs = load_config("configs/experiments/tiny-cpu.yaml", ["data.synthetic_task=programs", "reward.kind=code"])
    assert cache_dir(programs) != cache_dir(tiny)

"""The synthetic task's difficulty settings reach the problems (operators and operation counts), and the
warm start's slipped solutions."""

from __future__ import annotations

import random
import re

from areal_hpc.config.load import load_config
from areal_hpc.data.arithmetic import make_problem, make_splits, with_slip
from areal_hpc.data.prompts import train_and_eval_prompts
from areal_hpc.recipes.warm_start import Recipe, cache_dir, sft_and_validation


def operators_and_counts(prompts: list[str]) -> tuple[set[str], set[int]]:
    exprs = [re.fullmatch(r"Q: (.*) = \?\nA:", p).group(1) for p in prompts]
    ops = [re.findall(r"[+*-]", e) for e in exprs]
    return {o for found in ops for o in found}, {len(found) for found in ops}


def test_the_operators_and_the_longest_problem_are_the_configs() -> None:
    cfg = load_config("configs/experiments/tiny-cpu.yaml",
                      ["data.synthetic_ops=+-", "data.synthetic_max_ops=3", "data.synthetic_train_size=600"])
    train, [(name, held_out)] = train_and_eval_prompts(cfg.data, cfg.seed)
    assert name == "synthetic"
    ops, counts = operators_and_counts([r.prompt for r in train + held_out])
    assert ops == {"+", "-"} and counts == {1, 2, 3}
    assert not {r.prompt for r in train} & {r.prompt for r in held_out}


def test_the_default_task_is_unchanged_by_the_settings() -> None:
    """Every operator, up to 8 operations: the stream the cached warm start was trained beside."""
    train, held_out = make_splits(0, 2000, 128)
    ops, counts = operators_and_counts([p.prompt for p in train + held_out])
    assert ops == {"+", "-", "*"} and counts == set(range(1, 9))
    cfg = load_config("configs/experiments/tiny-cpu.yaml")
    rows, [(_, rows_held_out)] = train_and_eval_prompts(cfg.data, cfg.seed)
    expected_train, expected_held_out = make_splits(cfg.seed, len(rows), len(rows_held_out))
    assert [r.prompt for r in rows_held_out] == [p.prompt for p in expected_held_out]


def _evaluate(expr: str) -> int:
    """The value of a solution line's expression (integers, + - *, negative terms allowed)."""
    return eval(expr, {"__builtins__": {}})  # noqa: S307 - our own digits and operators


def test_a_slipped_solution_is_wrong_by_one_step_and_consistent_after_it() -> None:
    rng = random.Random(3)
    for _ in range(200):
        right = make_problem(rng, 4)
        slipped = with_slip(right, rng)
        assert slipped.prompt == right.prompt and slipped.answer != right.answer
        steps = slipped.solution.split(" so ")[0].split(" = ")
        assert slipped.solution.endswith(f"\\boxed{{{slipped.answer}}}")
        assert _evaluate(steps[-1].strip()) == int(slipped.answer)
        # Exactly one step breaks from the one before it (the slip): every other follows from it.
        question = right.prompt.removeprefix("Q: ").split(" = ?")[0]
        values = [_evaluate(question)] + [_evaluate(s.strip()) for s in steps]
        assert sum(a != b for a, b in zip(values, values[1:], strict=False)) == 1, slipped.solution


def test_the_warm_start_slips_the_configured_share_and_changes_its_cache_key() -> None:
    base = load_config("configs/experiments/quickstart.yaml", ["data.synthetic_warm_start_slips=0"])
    noisy = load_config("configs/experiments/quickstart.yaml", ["data.synthetic_warm_start_slips=0.4"])
    recipe = Recipe(sft_problems=2000)
    clean, _ = sft_and_validation(base, recipe)
    slipped, _ = sft_and_validation(noisy, recipe)
    wrong = sum(a.answer != b.answer for a, b in zip(clean, slipped, strict=True))
    assert [p.prompt for p in clean] == [p.prompt for p in slipped]
    assert 0.35 < wrong / len(clean) < 0.45
    assert cache_dir(base) != cache_dir(noisy)

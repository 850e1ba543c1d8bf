"""The synthetic task's difficulty settings reach the problems: operators and operation counts."""

from __future__ import annotations

import re

from areal_hpc.config.load import load_config
from areal_hpc.data.arithmetic import make_splits
from areal_hpc.data.prompts import train_and_eval_prompts


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

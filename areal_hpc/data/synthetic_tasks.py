"""The built-in synthetic tasks (data.synthetic_task), chosen in one place for everything that
uses them: the run's prompts, the tiny model's tokenizer and the warm start.

"arithmetic" (data/arithmetic.py) answers in \\boxed{}, scored by the math reward; "programs"
(data/program_task.py) answers with a program, scored by running it against the row's tests.
"""

from __future__ import annotations

import random

from areal_hpc.config.schema import DataConfig
from areal_hpc.data import arithmetic, program_task
from areal_hpc.data.arithmetic import Problem

# Problems whose prompt and worked solution the tiny model's tokenizer is trained on.
TOKENIZER_PROBLEMS = 2000


def make_splits(data: DataConfig, seed: int, train_size: int, eval_size: int) -> tuple[list[Problem], list[Problem]]:
    """Disjoint train and held-out problems of the configured task; held-out sets of one seed are
    prefixes of one sequence, whatever their size."""
    if data.synthetic_task == "programs":
        return program_task.make_splits(seed, train_size, eval_size)
    return arithmetic.make_splits(seed, train_size, eval_size, data.synthetic_max_ops, data.synthetic_ops)


def make_problem(data: DataConfig, rng: random.Random, max_ops: int) -> Problem:
    """One problem of the configured task (an arithmetic one of at most `max_ops` operations)."""
    if data.synthetic_task == "programs":
        return program_task.make_problem(rng)
    return arithmetic.make_problem(rng, max_ops, operators=data.synthetic_ops)


def with_slip(data: DataConfig, problem: Problem, rng: random.Random) -> Problem:
    """`problem` with a worked solution that slips once (a teacher's error, for the warm start)."""
    if data.synthetic_task == "programs":
        return program_task.with_slip(problem, rng)
    return arithmetic.with_slip(problem, rng)


def tokenizer_texts(task: str, seed: int) -> list[str]:
    """The text a tiny model's tokenizer learns from: prompts and worked solutions of `task` (the
    arithmetic task at its default difficulty, as every cached arithmetic model was built)."""
    make = program_task.make_splits if task == "programs" else arithmetic.make_splits
    train, _ = make(seed, TOKENIZER_PROBLEMS, 1)
    return [p.prompt + p.solution for p in train]

"""A synthetic reasoning task for the CPU profile: multi-step integer arithmetic.

Each problem is an expression of 1 to `max_ops` operations; the worked solution rewrites the
expression one operation at a time (multiplications first, then left to right) and ends in
\\boxed{answer}. Solution length grows with the number of operations, so a batch mixes very short
and long sequences, like reasoning traces do.
"""

from __future__ import annotations

import random
import re
from collections.abc import Callable
from dataclasses import dataclass

PROMPT_TEMPLATE = "Q: {expr} = ?\nA:"


@dataclass(frozen=True)
class Problem:
    prompt: str
    answer: str
    # The worked solution that follows the prompt (used for SFT warm start).
    solution: str


def _render(terms: list[int], ops: list[str]) -> str:
    out = str(terms[0])
    for op, t in zip(ops, terms[1:], strict=True):
        out += f"{op}{t}"
    return out


def _reduce_once(terms: list[int], ops: list[str]) -> tuple[list[int], list[str]]:
    """Evaluate one operation: the first multiplication, else the leftmost addition/subtraction."""
    i = ops.index("*") if "*" in ops else 0
    a, b, op = terms[i], terms[i + 1], ops[i]
    value = a * b if op == "*" else a + b if op == "+" else a - b
    return terms[:i] + [value] + terms[i + 2 :], ops[:i] + ops[i + 1 :]


def solve(terms: list[int], ops: list[str], slip: tuple[int, int] | None = None) -> tuple[list[str], int]:
    """The intermediate expressions after each step, and the final value. `slip` = (step, delta)
    adds delta to the value that step computes, and every later step carries it on."""
    steps = []
    while ops:
        i = ops.index("*") if "*" in ops else 0
        terms, ops = _reduce_once(terms, ops)
        if slip is not None and slip[0] == len(steps):
            terms[i] += slip[1]
        steps.append(_render(terms, ops))
    return steps, terms[0]


def _solution(steps: list[str], value: int) -> str:
    return " " + " = ".join(steps) + f" so \\boxed{{{value}}}"


def with_slip(problem: Problem, rng: random.Random) -> Problem:
    """`problem` with a worked solution that slips once, at a random step, by 1 to 3 either way,
    and ends in the wrong answer that follows (`answer` is then that wrong value)."""
    expr = problem.prompt.removeprefix("Q: ").split(" = ?")[0]
    tokens = re.findall(r"\d+|[-+*]", expr)
    terms, ops = [int(t) for t in tokens[::2]], tokens[1::2]
    slip = (rng.randrange(len(ops)), rng.choice((-3, -2, -1, 1, 2, 3)))
    steps, value = solve(terms, ops, slip)
    return Problem(prompt=problem.prompt, answer=str(value), solution=_solution(steps, value))


# The operators a problem draws from (data.synthetic_ops chooses a subset).
OPERATORS = "+-*"
MAX_OPS = 8


def make_problem(rng: random.Random, max_ops: int = MAX_OPS, n_ops: int | None = None,
                 operators: str = OPERATORS) -> Problem:
    """A problem of `n_ops` operations, or of 1 to `max_ops` with fewer more likely (many short
    solutions, a long tail of long ones), its operators drawn from `operators`."""
    if n_ops is None:
        n_ops = rng.choices(range(1, max_ops + 1), weights=range(max_ops, 0, -1))[0]
    terms = [rng.randint(1, 9) for _ in range(n_ops + 1)]
    ops = [rng.choice(operators) for _ in range(n_ops)]
    expr = _render(terms, ops)
    steps, value = solve(terms, ops)
    return Problem(prompt=PROMPT_TEMPLATE.format(expr=expr), answer=str(value), solution=_solution(steps, value))


def make_splits(seed: int, train_size: int, eval_size: int, max_ops: int = MAX_OPS,
                operators: str = OPERATORS) -> tuple[list[Problem], list[Problem]]:
    """Disjoint train and held-out sets (no held-out prompt appears in training)."""
    rng = random.Random(seed)
    return disjoint_splits(lambda: make_problem(rng, max_ops, operators=operators), train_size, eval_size)


def disjoint_splits(draw: Callable[[], Problem], train_size: int, eval_size: int) -> tuple[list[Problem], list[Problem]]:
    """`eval_size` distinct held-out problems first, then `train_size` training problems none of
    whose prompts is held out: the held-out set of a seed is a prefix of one sequence, whatever
    its size, and training never sees it."""
    held_out: dict[str, Problem] = {}
    while len(held_out) < eval_size:
        p = draw()
        held_out.setdefault(p.prompt, p)
    train = []
    while len(train) < train_size:
        p = draw()
        if p.prompt not in held_out:
            train.append(p)
    return train, list(held_out.values())

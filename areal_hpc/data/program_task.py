"""A synthetic code task for the CPU profile: infer a hidden function from examples, write the program.

The prompt shows EXAMPLES input/output pairs of a hidden y = a*x + b; the answer is input/output
tests (the APPS / AReaL `{"inputs", "outputs"}` form the code reward runs) on hidden inputs beyond
the examples' range, so a program that replays the examples fails. The worked solution, used by the
warm start, is a two-line program in a python fence, the block the code reward's extractor takes.
Reading b off f(0) is easy, the slope a takes a subtraction (and a division when the inputs are
not adjacent), so a briefly trained tiny model samples the right program for many problems only
some of the time: what RL sharpens.
"""

from __future__ import annotations

import json
import random
import re

from areal_hpc.data.arithmetic import Problem, disjoint_splits

PROMPT_TEMPLATE = "Read x, print f(x).\n{examples}\n"
SOLUTION_TEMPLATE = "```python\nx=int(input())\nprint({a}*x{b:+d})\n```"
EXAMPLES = 3
# The hidden function's coefficients and the examples' inputs: 5 x 10 functions, 20 sets of
# inputs. Measured with the tiny model (plain-torch SFT, batch 16): offsets down to -9 and inputs up
# to 9 leave sampled pass@1 below 0.1 after 2400 steps; these reach greedy accuracy 0.48, sampled
# pass@1 0.39 and pass@16 0.83 after 750.
SLOPES = range(1, 6)
OFFSETS = range(0, 10)
EXAMPLE_INPUTS = range(0, 6)
# Hidden test inputs: none of them is an example input.
TEST_INPUTS = range(10, 100)
TESTS = 4


def tests_json(a: int, b: int, inputs: list[int]) -> str:
    """The reference answer: the function's input/output tests as the code reward reads them."""
    return json.dumps({"inputs": [f"{x}\n" for x in inputs], "outputs": [f"{a * x + b}\n" for x in inputs]})


def make_problem(rng: random.Random) -> Problem:
    """One hidden function, its examples in increasing input order, and its hidden tests."""
    a, b = rng.choice(SLOPES), rng.choice(OFFSETS)
    shown = sorted(rng.sample(EXAMPLE_INPUTS, EXAMPLES))
    examples = "\n".join(f"f({x})={a * x + b}" for x in shown)
    return Problem(prompt=PROMPT_TEMPLATE.format(examples=examples),
                   answer=tests_json(a, b, rng.sample(TEST_INPUTS, TESTS)),
                   solution=SOLUTION_TEMPLATE.format(a=a, b=b))


def with_slip(problem: Problem, rng: random.Random) -> Problem:
    """`problem` with a worked solution that slips: its slope or its offset off by one either way,
    so the program fails the problem's tests (`answer`, unchanged)."""
    a, b = map(int, re.fullmatch(r"```python\nx=int\(input\(\)\)\nprint\((\d+)\*x([+-]\d+)\)\n```",
                                 problem.solution).groups())
    delta = rng.choice((-1, 1))
    if rng.random() < 0.5:
        a += delta
    else:
        b += delta
    return Problem(prompt=problem.prompt, answer=problem.answer, solution=SOLUTION_TEMPLATE.format(a=a, b=b))


def make_splits(seed: int, train_size: int, eval_size: int) -> tuple[list[Problem], list[Problem]]:
    """Disjoint train and held-out sets (no held-out prompt appears in training)."""
    rng = random.Random(f"programs/{seed}")
    return disjoint_splits(lambda: make_problem(rng), train_size, eval_size)

"""Every prompt's reward reference, built once for the whole run from the data rows, and the rows
whose reference would score every response wrong refused at launch, by their row numbers.

Preflight builds them for the launch and `areal-hpc data check` for a data set before one.
"""

from __future__ import annotations

import sys

from areal_hpc.config.schema import RewardConfig
from areal_hpc.errors import DataError, UserError
from areal_hpc.prompt_row import PromptRow
from areal_hpc.reward.code_tests import TestFormatError, parse_tests
from areal_hpc.reward.probe import ProbeFailed, check_in_child
from areal_hpc.reward.task import CodeReference, CustomReference, MathReference, Reference, kind_of

# Bad references named in the error before the count of the rest.
SHOWN_PROBLEMS = 5
# Distinct references from which the check says what it is doing (0.5-3 ms each).
PROGRESS_REFERENCES = 5000


# Rows with their 1-based row numbers in the file (the numbers errors name).
Numbered = list[tuple[int, PromptRow]]


def _refuse(total: int, bad: list[str], problem: str, what: str) -> DataError:
    more = f"; and {len(bad) - SHOWN_PROBLEMS} more rows" if len(bad) > SHOWN_PROBLEMS else ""
    return DataError(f"{what}: {len(bad)} of {total} rows have {problem}: " + "; ".join(bad[:SHOWN_PROBLEMS]) + more)


def references(rows: list[PromptRow], reward: RewardConfig, what: str) -> list[Reference]:
    """Every row's reward reference, built once for the whole run: generators score each sample
    with it as it comes. Each row is scored by its data source's kind (reward.by_source, else
    reward.kind). A reference that would score every response wrong, silently, for the whole run
    (code tests that do not parse, a math answer math-verify finds no expression in, a custom
    function that does not import or fails) refuses the launch now, naming its rows."""
    routed: dict[str, Numbered] = {}
    for n, row in enumerate(rows, 1):
        routed.setdefault(kind_of(row.data_source, reward), []).append((n, row))
    refs: dict[int, Reference] = {}
    for kind, numbered in routed.items():
        if kind == "code":
            refs.update(_code_references(numbered, len(rows), what))
        elif kind == "custom":
            refs.update(_custom_references(numbered, reward, what))
        else:
            _check_math_references(numbered, len(rows), reward.timeout_s, what)
            refs.update((n, MathReference(row.answer)) for n, row in numbered)
    return [refs[n] for n in range(1, len(rows) + 1)]


def _code_references(numbered: Numbered, total: int, what: str) -> dict[int, Reference]:
    refs: dict[int, Reference] = {}
    bad = []
    for n, row in numbered:
        try:
            refs[n] = CodeReference(parse_tests(row.answer, f"row {n}"))
        except TestFormatError as e:
            bad.append(str(e))
    if bad:
        raise _refuse(total, bad, "unusable tests", what)
    return refs


def _custom_references(numbered: Numbered, reward: RewardConfig, what: str) -> dict[int, Reference]:
    """The function is imported and called once, on the first of these rows with its ground truth
    as the response, so a typo or a function that cannot run fails the launch, not every sample of
    the run. It runs in a child process (reward/probe.py): one that ends its process is named."""
    refs: dict[int, Reference] = {n: CustomReference(row.data_source, row.answer, row.extra_info or {})
                                  for n, row in numbered}
    n, row = numbered[0]
    try:
        check_in_child(str(reward.function), refs[n].task(row.answer), reward.timeout_s, reward.memory_mb)
    except ProbeFailed as e:
        raise UserError(f"reward.function = {reward.function!r}: called on row {n} of {what} (data_source"
                        f" {row.data_source!r}, its ground truth as the response), it {e}") from None
    return refs


def _check_math_references(numbered: Numbered, total: int, timeout_s: float, what: str) -> None:
    """Name the math references that math-verify cannot parse. Each distinct reference is parsed
    once (0.5-3 ms)."""
    from areal_hpc.reward.math_check import reference_problem

    distinct = len({row.answer for _, row in numbered})
    if distinct >= PROGRESS_REFERENCES:
        print(f"rank 0 (controller): checking {distinct} distinct reference answers of {what}"
              f" (about {distinct * 0.001:.0f} s)", file=sys.stderr, flush=True)
    verdicts: dict[str, str | None] = {}
    bad = []
    for n, row in numbered:
        if row.answer not in verdicts:
            verdicts[row.answer] = reference_problem(row.answer, timeout_s)
        if verdicts[row.answer] is not None:
            bad.append(f"row {n}: {verdicts[row.answer]}")
    if bad:
        raise _refuse(total, bad, "an unusable reference answer", what)

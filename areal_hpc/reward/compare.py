"""Judging a program's output against the expected one, the way competitive judges do.

Standard output is compared token by token, so spacing, line breaks and trailing blanks do not
matter; real numbers written with a decimal point or exponent may differ by 1e-6 (relative or
absolute), since such problems accept approximate answers. Return values are compared
structurally, with the same tolerance for floats; as in APPS, an expected value wrapped in a
one-element list also matches the bare value.
"""

from __future__ import annotations

import math
from typing import Any

FLOAT_TOL = 1e-6


def _float(token: str) -> float | None:
    try:
        value = float(token)
    except ValueError:
        return None
    return value if math.isfinite(value) else None


def _tokens_match(actual: str, expected: str) -> bool:
    if actual == expected:
        return True
    if not any(c in expected for c in ".eE"):
        return False
    a, e = _float(actual), _float(expected)
    return a is not None and e is not None and math.isclose(a, e, rel_tol=FLOAT_TOL, abs_tol=FLOAT_TOL)


def stdout_matches(actual: str, expected: str) -> bool:
    """Whitespace-insensitive comparison of standard output."""
    got, want = actual.split(), expected.split()
    return len(got) == len(want) and all(_tokens_match(a, e) for a, e in zip(got, want, strict=True))


def _values_equal(actual: Any, expected: Any) -> bool:
    if isinstance(actual, bool) or isinstance(expected, bool):
        return type(actual) is type(expected) and actual == expected
    if isinstance(actual, int | float) and isinstance(expected, int | float):
        if isinstance(actual, int) and isinstance(expected, int):
            return actual == expected
        try:
            return math.isclose(actual, expected, rel_tol=FLOAT_TOL, abs_tol=FLOAT_TOL)
        except OverflowError:  # an int beyond float range against a float
            return False
    if isinstance(actual, list) and isinstance(expected, list):
        return len(actual) == len(expected) and all(
            _values_equal(a, e) for a, e in zip(actual, expected, strict=True)
        )
    if isinstance(actual, dict) and isinstance(expected, dict):
        return actual.keys() == expected.keys() and all(_values_equal(actual[k], expected[k]) for k in actual)
    return type(actual) is type(expected) and actual == expected


def return_matches(actual: Any, expected: Any) -> bool:
    """Compare a call's JSON-decoded return value (tuples arrive as lists) with the expected one."""
    if _values_equal(actual, expected):
        return True
    return isinstance(expected, list) and len(expected) == 1 and _values_equal(actual, expected[0])


def shorten(value: Any, limit: int = 80) -> str:
    """A one-line excerpt of a value for a verdict's reason."""
    text = value if isinstance(value, str) else repr(value)
    text = text.replace("\n", "\\n")
    return text if len(text) <= limit else text[: limit - 3] + "..."

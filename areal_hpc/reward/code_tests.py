"""Test cases of a coding problem, in the format of the public code data sets.

APPS, TACO and LiveCodeBench store tests as a JSON object `{"inputs": [...], "outputs": [...]}`,
optionally with `fn_name`. Without `fn_name` each input is standard input and each output the
expected standard output (strings, or lists of lines). With `fn_name` each input is the argument
list of a call and each output the expected return value; LiveCodeBench writes such inputs as
strings of newline-separated JSON values, which are decoded here. The same loader serves the data
sets and `areal-hpc reward code --tests`.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from areal_hpc.errors import UserError


class TestFormatError(UserError):
    """Tests that are not in the data-set format."""

    __test__ = False  # an error type, not a pytest class


@dataclass(frozen=True)
class TestCase:
    __test__ = False  # a data type, not a pytest class

    # Standard input text, or the argument list of a call.
    input: str | list
    # Expected standard output text, or the expected return value of a call.
    expected: Any


@dataclass(frozen=True)
class TestSuite:
    __test__ = False  # a data type, not a pytest class

    cases: tuple[TestCase, ...]
    # Name of the function (or Solution method) to call; None for standard input/output tests.
    fn_name: str | None = None

    @property
    def is_call(self) -> bool:
        return self.fn_name is not None

    def to_json(self) -> dict:
        obj: dict[str, Any] = {
            "inputs": [c.input for c in self.cases],
            "outputs": [c.expected for c in self.cases],
        }
        if self.fn_name is not None:
            obj["fn_name"] = self.fn_name
        return obj

    @classmethod
    def from_json(cls, obj: Any) -> TestSuite:
        return parse_tests(obj)


def _text(value: Any, where: str) -> str:
    """Standard input or output: a string, or a list of lines."""
    if isinstance(value, str):
        return value
    if isinstance(value, list) and all(isinstance(line, str) for line in value):
        return "\n".join(value) + "\n"
    if isinstance(value, int | float) and not isinstance(value, bool):
        return str(value)
    raise TestFormatError(f"{where}: expected a string or a list of lines, got {type(value).__name__}")


def _call_args(value: Any, where: str) -> list:
    """Arguments of a call: a JSON list, or LiveCodeBench's one JSON value per line."""
    if isinstance(value, list):
        return value
    if isinstance(value, str):
        try:
            return [json.loads(line) for line in value.splitlines() if line.strip()]
        except json.JSONDecodeError as e:
            raise TestFormatError(f"{where}: argument line is not JSON: {e}") from None
    raise TestFormatError(f"{where}: expected a list of arguments, got {type(value).__name__}")


def _call_expected(value: Any, arg_was_text: bool, where: str) -> Any:
    """LiveCodeBench writes the expected value as JSON text when it writes the input as text."""
    if arg_was_text and isinstance(value, str):
        try:
            return json.loads(value)
        except json.JSONDecodeError as e:
            raise TestFormatError(f"{where}: expected value is not JSON: {e}") from None
    return value


def parse_tests(obj: Any, source: str = "tests") -> TestSuite:
    """Validate and normalise one problem's tests (a dict or its JSON text)."""
    if isinstance(obj, str):
        try:
            obj = json.loads(obj)
        except json.JSONDecodeError as e:
            raise TestFormatError(f"{source}: not valid JSON: {e}") from None
    if not isinstance(obj, dict):
        raise TestFormatError(f"{source}: expected a JSON object with 'inputs' and 'outputs'")
    missing = [k for k in ("inputs", "outputs") if k not in obj]
    if missing:
        raise TestFormatError(f"{source}: missing key {', '.join(repr(k) for k in missing)}")
    inputs, outputs = obj["inputs"], obj["outputs"]
    if not isinstance(inputs, list) or not isinstance(outputs, list):
        raise TestFormatError(f"{source}: 'inputs' and 'outputs' must be lists")
    if len(inputs) != len(outputs):
        raise TestFormatError(f"{source}: {len(inputs)} inputs but {len(outputs)} outputs")
    if not inputs:
        raise TestFormatError(f"{source}: no test cases")
    fn_name = obj.get("fn_name") or None
    if fn_name is not None and not (isinstance(fn_name, str) and fn_name.isidentifier()):
        raise TestFormatError(f"{source}: 'fn_name' must be a Python identifier, got {fn_name!r}")
    cases = []
    for i, (inp, out) in enumerate(zip(inputs, outputs, strict=True)):
        if fn_name is None:
            cases.append(TestCase(_text(inp, f"{source}: inputs[{i}]"), _text(out, f"{source}: outputs[{i}]")))
        else:
            args = _call_args(inp, f"{source}: inputs[{i}]")
            cases.append(TestCase(args, _call_expected(out, isinstance(inp, str), f"{source}: outputs[{i}]")))
    return TestSuite(tuple(cases), fn_name)


def load_tests(path: str | Path) -> TestSuite:
    """Read a tests file (one JSON object in the data-set format)."""
    path = Path(path)
    try:
        text = path.read_text()
    except OSError as e:
        raise TestFormatError(f"{path}: cannot read tests file: {e.strerror}") from None
    return parse_tests(text, str(path))

"""Test cases of a coding problem, in the format of the public code data sets.

APPS, TACO and LiveCodeBench store tests as a JSON object `{"inputs": [...], "outputs": [...]}`,
optionally with `fn_name`. Without `fn_name` each input is standard input and each output the
expected standard output (strings, or lists of lines). With `fn_name` each input is the argument
list of a call and each output the expected return value; LiveCodeBench writes such inputs as
strings of newline-separated JSON values, which are decoded here.

Assert-style tests are Python run after the program, in its namespace: HumanEval's
`{"test": ..., "entry_point": ...}` (the test defines `check(candidate)`, called with the
program's `entry_point` function) and MBPP's `{"test_list": [...], "test_setup_code": ...}`
(assert lines, after the optional setup). Each MBPP line is one case. A HumanEval `check` whose
body is only asserts is split into one case per assert (the asserts then cannot depend on each
other); any other `check` (loops, helper variables) is a single case.

The shape is told by the object's keys; the same loader serves the data sets and
`areal-hpc reward code --tests`.
"""

from __future__ import annotations

import ast
import copy
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

    # Standard input text, the argument list of a call, or (assert suites) the Python source run
    # after the program.
    input: str | list
    # Expected standard output text, or the expected return value of a call; None for assert
    # suites (the source asserts it).
    expected: Any


@dataclass(frozen=True)
class TestSuite:
    __test__ = False  # a data type, not a pytest class

    cases: tuple[TestCase, ...]
    # Name of the function (or Solution method) to call; None for standard input/output tests.
    fn_name: str | None = None
    # Assert suites: the HumanEval or MBPP test object the cases were made from (what to_json gives
    # back, so the cases are made again from it on the other side of a process boundary).
    asserts: dict[str, Any] | None = None

    @property
    def kind(self) -> str:
        """"stdio", "call" or "assert": how the harness runs a case and the judge reads it."""
        return "assert" if self.asserts is not None else "call" if self.fn_name is not None else "stdio"

    @property
    def is_call(self) -> bool:
        return self.fn_name is not None

    def to_json(self) -> dict:
        if self.asserts is not None:
            return dict(self.asserts)
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


def _python(text: Any, where: str) -> ast.Module:
    """Test source as the data set gives it: a string of valid Python."""
    if not isinstance(text, str):
        raise TestFormatError(f"{where}: expected Python source (a string), got {type(text).__name__}")
    try:
        return ast.parse(text, "<test>")
    except SyntaxError as e:
        raise TestFormatError(f"{where}: not valid Python: {e.msg} (line {e.lineno})") from None


def _only_asserts(body: list[ast.stmt]) -> list[ast.Assert] | None:
    """The asserts of a body made of asserts alone (a leading docstring and `assert True`-like
    asserts of a constant, which check nothing, left out); None if anything else is in it."""
    asserts = []
    for stmt in body:
        if isinstance(stmt, ast.Expr) and isinstance(stmt.value, ast.Constant) and isinstance(stmt.value.value, str):
            continue
        if not isinstance(stmt, ast.Assert):
            return None
        if not (isinstance(stmt.test, ast.Constant) and stmt.test.value):
            asserts.append(stmt)
    return asserts


def _humaneval(obj: dict, source: str) -> TestSuite:
    if "entry_point" not in obj:
        raise TestFormatError(f"{source}: missing key 'entry_point' (the function HumanEval's check() tests)")
    test, entry = obj["test"], obj["entry_point"]
    if not (isinstance(entry, str) and entry.isidentifier()):
        raise TestFormatError(f"{source}: 'entry_point' must be a Python identifier, got {entry!r}")
    module = _python(test, f"{source}: 'test'")
    checks = [i for i, s in enumerate(module.body) if isinstance(s, ast.FunctionDef) and s.name == "check"]
    if not checks or not module.body[checks[-1]].args.args:
        raise TestFormatError(f"{source}: 'test' defines no check(candidate) function")
    call = f"\ncheck({entry})\n"
    asserts = _only_asserts(module.body[checks[-1]].body)
    if not asserts:
        sources = [test + "\n" + call]
    else:
        sources = []
        for one in asserts:
            single = copy.deepcopy(module)
            single.body[checks[-1]].body = [one]
            sources.append(ast.unparse(single) + "\n" + call)
    return TestSuite(tuple(TestCase(s, None) for s in sources), asserts={"test": test, "entry_point": entry})


def _mbpp(obj: dict, source: str) -> TestSuite:
    lines, setup = obj["test_list"], obj.get("test_setup_code") or ""
    if not isinstance(lines, list):
        raise TestFormatError(f"{source}: 'test_list' must be a list of assert lines")
    if not lines:
        raise TestFormatError(f"{source}: no test cases")
    _python(setup, f"{source}: 'test_setup_code'")
    for i, line in enumerate(lines):
        where = f"{source}: test_list[{i}]"
        if not _only_asserts(_python(line, where).body):
            raise TestFormatError(f"{where}: expected assert statements, got {line.strip()[:60]!r}")
    prefix = setup + "\n" if setup.strip() else ""
    return TestSuite(tuple(TestCase(prefix + line + "\n", None) for line in lines),
                     asserts={"test_list": list(lines), "test_setup_code": setup})


def parse_tests(obj: Any, source: str = "tests") -> TestSuite:
    """Validate and normalise one problem's tests (a dict or its JSON text), of any shape above."""
    if isinstance(obj, str):
        try:
            obj = json.loads(obj)
        except json.JSONDecodeError as e:
            raise TestFormatError(f"{source}: not valid JSON: {e}") from None
    if not isinstance(obj, dict):
        raise TestFormatError(f"{source}: expected a JSON object of tests, got {type(obj).__name__}")
    if "inputs" not in obj and "outputs" not in obj:
        if "test_list" in obj:
            return _mbpp(obj, source)
        if "test" in obj:
            return _humaneval(obj, source)
        raise TestFormatError(f"{source}: expected 'inputs' and 'outputs' (APPS, TACO, LiveCodeBench), 'test' and "
                              f"'entry_point' (HumanEval) or 'test_list' (MBPP); got keys {sorted(obj)}")
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

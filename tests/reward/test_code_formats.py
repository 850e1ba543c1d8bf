"""Pure pieces of the code reward: program extraction, the tests format, output comparison."""

from __future__ import annotations

import json

import pytest
from hypothesis import given
from hypothesis import strategies as st

from areal_hpc.reward.code_extract import extract_code
from areal_hpc.reward.code_tests import TestFormatError, TestSuite, load_tests, parse_tests
from areal_hpc.reward.compare import return_matches, stdout_matches

# --- extracting the program -------------------------------------------------------------------


def test_last_python_block_wins() -> None:
    text = "Try:\n```python\nprint(1)\n```\nBetter:\n```python\nprint(2)\n```\nDone."
    assert extract_code(text) == "print(2)\n"


def test_python_block_preferred_over_other_languages() -> None:
    text = "```python\nprint(1)\n```\nRun it with:\n```bash\npython a.py\n```\n"
    assert extract_code(text) == "print(1)\n"


def test_untagged_block_and_tag_variants() -> None:
    assert extract_code("```\nx = 1\n```") == "x = 1\n"
    assert extract_code("```py3\nx = 2\n```") == "x = 2\n"
    assert extract_code("```Python title=sol.py\nx = 3\n```") == "x = 3\n"
    assert extract_code("```cpp\nint main(){}\n```") == "int main(){}\n"


def test_longer_fences_hold_inner_fences() -> None:
    text = "````python\ns = '''\n```\n'''\nprint(s)\n````"
    assert extract_code(text) == "s = '''\n```\n'''\nprint(s)\n"


def test_text_without_fences_is_the_program() -> None:
    assert extract_code("print(input())\n") == "print(input())\n"


# --- the tests format ---------------------------------------------------------------------------


def test_stdio_tests_normalise_lines() -> None:
    suite = parse_tests({"inputs": ["1 2\n", ["3 4", "5"]], "outputs": ["3\n", ["7", "5"]]})
    assert not suite.is_call
    assert [c.input for c in suite.cases] == ["1 2\n", "3 4\n5\n"]
    assert [c.expected for c in suite.cases] == ["3\n", "7\n5\n"]


def test_call_tests_apps_style() -> None:
    suite = parse_tests(json.dumps({"fn_name": "add", "inputs": [[1, 2]], "outputs": [[3]]}))
    assert suite.is_call and suite.fn_name == "add"
    assert (suite.cases[0].input, suite.cases[0].expected) == ([1, 2], [3])


def test_call_tests_livecodebench_style_decode_json_lines() -> None:
    suite = parse_tests({"fn_name": "f", "inputs": ["[1, 2]\n\"a\""], "outputs": ["true"]})
    assert (suite.cases[0].input, suite.cases[0].expected) == ([[1, 2], "a"], True)


def test_round_trip_through_json() -> None:
    suite = parse_tests({"fn_name": "f", "inputs": [[1], [2]], "outputs": [1, 4]})
    assert TestSuite.from_json(json.loads(json.dumps(suite.to_json()))) == suite


@pytest.mark.parametrize(
    "obj, problem",
    [
        ("{not json", "not valid JSON"),
        ([1, 2], "expected a JSON object"),
        ({"inputs": ["1"]}, "missing key 'outputs'"),
        ({"inputs": "1", "outputs": "1"}, "must be lists"),
        ({"inputs": ["1", "2"], "outputs": ["1"]}, "2 inputs but 1 outputs"),
        ({"inputs": [], "outputs": []}, "no test cases"),
        ({"inputs": [{"a": 1}], "outputs": ["1"]}, "inputs[0]: expected a string"),
        ({"fn_name": "not valid", "inputs": [[1]], "outputs": [1]}, "'fn_name' must be a Python identifier"),
        ({"fn_name": "f", "inputs": [5], "outputs": [1]}, "inputs[0]: expected a list of arguments"),
        ({"fn_name": "f", "inputs": ["[1"], "outputs": ["1"]}, "argument line is not JSON"),
    ],
)
def test_bad_tests_name_the_problem(obj: object, problem: str) -> None:
    with pytest.raises(TestFormatError, match=problem.replace("[", r"\[").replace("]", r"\]")):
        parse_tests(obj)


def test_load_tests_file(tmp_path) -> None:
    path = tmp_path / "t.json"
    path.write_text(json.dumps({"inputs": ["1\n"], "outputs": ["1\n"]}))
    assert len(load_tests(path).cases) == 1
    with pytest.raises(TestFormatError, match="cannot read tests file"):
        load_tests(tmp_path / "missing.json")


# --- comparing outputs --------------------------------------------------------------------------


@pytest.mark.parametrize(
    "actual, expected, same",
    [
        ("3\n", "3", True),
        ("1 2  3\r\n4\n\n", "1 2 3\n4", True),
        ("1\n2", "1 2", True),
        ("3", "4", False),
        ("1 2", "1 2 3", False),
        ("0.3333333", "0.333333333", True),
        ("0.34", "0.333333", False),
        ("1", "1.0", True),
        ("01", "1", False),
        ("YES", "yes", False),
        ("", "", True),
        ("inf", "inf.0", False),
    ],
)
def test_stdout_matches(actual: str, expected: str, same: bool) -> None:
    assert stdout_matches(actual, expected) is same


@given(tokens=st.lists(st.text(alphabet="abc019-.", min_size=1, max_size=4), max_size=8),
       seps=st.lists(st.sampled_from([" ", "  ", "\n", "\t", " \n", "\r\n"]), min_size=9, max_size=9))
def test_stdout_ignores_how_tokens_are_spaced(tokens: list[str], seps: list[str]) -> None:
    respaced = "".join(t + s for t, s in zip(tokens, seps, strict=False))
    assert stdout_matches(respaced, " ".join(tokens))
    assert not stdout_matches(respaced + " extra", " ".join(tokens))


@pytest.mark.parametrize(
    "actual, expected, same",
    [
        (3, 3, True),
        (3, [3], True),
        ([1, 2], [1, 2], True),
        ([1, 2], [[1, 2]], True),
        ([1, 2], [2, 1], False),
        (0.1 + 0.2, 0.3, True),
        (1, 1.0, True),
        (True, 1, False),
        (True, [True], True),
        ("a", "a", True),
        ("a", "b", False),
        ({"k": [1.0]}, {"k": [1]}, True),
        ({"k": 1}, {"j": 1}, False),
        (10**400, 1.0, False),
        (None, None, True),
    ],
)
def test_return_matches(actual: object, expected: object, same: bool) -> None:
    assert return_matches(actual, expected) is same

"""Reward references are built once at preflight, and a row that cannot be scored refuses the launch."""

from __future__ import annotations

import json

import pytest

from areal_hpc.config.schema import RewardConfig
from areal_hpc.data.prompts import DataError, PromptRow
from areal_hpc.reward.code_tests import TestSuite
from areal_hpc.reward.task import CodeReference, MathReference
from areal_hpc.runtime.preflight import references

ADD = json.dumps({"inputs": ["1 2\n"], "outputs": ["3\n"]})


def test_code_rows_become_parsed_test_suites():
    refs = references([PromptRow("add", ADD), PromptRow("add again", ADD)], RewardConfig(kind="code"), "d.jsonl")
    assert all(isinstance(r, CodeReference) and isinstance(r.tests, TestSuite) for r in refs)
    assert refs[0].tests.cases[0].expected == "3\n"


def test_a_bad_code_test_row_is_refused_naming_the_file_and_row():
    rows = [PromptRow("ok", ADD), PromptRow("bad", '{"inputs": ["1\\n"]}'), PromptRow("worse", "not json")]
    with pytest.raises(DataError, match=r"^d\.jsonl: 2 of 3 rows have unusable tests: row 2: missing key 'outputs';"
                                        r" row 3: not valid JSON"):
        references(rows, RewardConfig(kind="code"), "d.jsonl")


def test_math_rows_keep_their_answer():
    assert references([PromptRow("1+1?", "2")], RewardConfig(), "d.jsonl") == [MathReference("2")]

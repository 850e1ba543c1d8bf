"""Reward references are built once at preflight, and a row that cannot be scored refuses the launch."""

from __future__ import annotations

import json

import pytest

from areal_hpc.config.schema import RewardConfig
from areal_hpc.errors import DataError, UserError
from areal_hpc.prompt_row import PromptRow
from areal_hpc.reward.code_tests import TestSuite
from areal_hpc.reward.references import references
from areal_hpc.reward.task import CodeReference, CustomReference, MathReference

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


SCORE = '''
def compute_score(data_source, solution_str, ground_truth, extra_info=None):
    if "{fail}" and data_source == "mine":
        raise ValueError("{fail}")
    return float(solution_str == ground_truth)
'''


def custom_config(tmp_path, fail: str = "", **kw) -> RewardConfig:
    (tmp_path / "score.py").write_text(SCORE.format(fail=fail))
    return RewardConfig(function=f"{tmp_path / 'score.py'}:compute_score", **kw)


def test_rows_are_routed_by_data_source_in_place(tmp_path):
    rows = [PromptRow("add", ADD, "apps"), PromptRow("1+1?", "2"), PromptRow("mine", "x", "mine", {"id": 7}),
            PromptRow("2+2?", "4", "openai/gsm8k")]
    reward = custom_config(tmp_path, by_source={"apps": "code", "mine": "custom"})
    refs = references(rows, reward, "d.jsonl")
    assert isinstance(refs[0], CodeReference)
    assert refs[1] == MathReference("2") and refs[3] == MathReference("4")  # default kind; unlisted source
    assert refs[2] == CustomReference("mine", "x", {"id": 7})
    custom = references(rows[1:2], custom_config(tmp_path, kind="custom"), "d.jsonl")
    assert custom == [CustomReference(None, "2", {})]  # no data_source: the default kind, no extra_info


def test_mixed_rows_are_named_by_their_row_in_the_file(tmp_path):
    reward = RewardConfig(by_source={"apps": "code"})
    rows = [PromptRow("1+1?", "2"), PromptRow("bad", "not json", "apps"), PromptRow("2+2?", "4", "gsm8k")]
    with pytest.raises(DataError, match=r"^d\.jsonl: 1 of 3 rows have unusable tests: row 2: not valid JSON"):
        references(rows, reward, "d.jsonl")
    rows = [PromptRow("1+1?", "2"), PromptRow("add", ADD, "apps"), PromptRow("?", "\\frac{1", "gsm8k")]
    with pytest.raises(DataError, match=r"^d\.jsonl: 1 of 3 rows have an unusable reference answer: row 3: "):
        references(rows, reward, "d.jsonl")


def test_a_custom_function_that_fails_on_a_sample_row_refuses_the_launch(tmp_path):
    rows = [PromptRow("1+1?", "2"), PromptRow("mine", "x", "mine")]
    reward = custom_config(tmp_path, fail="boom", by_source={"mine": "custom"})
    with pytest.raises(UserError, match=r"reward.function = '.*score.py:compute_score': called on row 2 of d.jsonl"
                                        r" \(data_source 'mine', its ground truth as the response\), it raised"
                                        r" ValueError: boom"):
        references(rows, reward, "d.jsonl")


@pytest.mark.parametrize("body, ended", [
    ("import os; os._exit(3)", "the process exited with status 3"),
    ("import os, signal; print('about to die', flush=True); os.kill(os.getpid(), signal.SIGKILL)",
     "the process was killed by SIGKILL (a reward function must return a number, not exit); its last output:\n"
     "about to die"),
])
def test_a_custom_function_that_ends_its_process_is_named_and_the_caller_lives(tmp_path, body, ended):
    """The launch check calls the function in a child process: rank 0 must outlive a function that
    exits or is killed, and say so."""
    (tmp_path / "dies.py").write_text(f"def compute_score(data_source, solution_str, ground_truth, extra_info=None):"
                                      f"\n    {body}\n")
    reward = RewardConfig(kind="custom", function=f"{tmp_path / 'dies.py'}:compute_score")
    with pytest.raises(UserError) as caught:
        references([PromptRow("1+1?", "2")], reward, "d.jsonl")
    assert str(caught.value).startswith(f"reward.function = {reward.function!r}: called on row 1 of d.jsonl")
    assert f"it ended its process before returning: {ended}" in str(caught.value)


def test_a_custom_function_that_does_not_import_refuses_the_launch(tmp_path):
    reward = RewardConfig(kind="custom", function=f"{tmp_path / 'missing.py'}:compute_score")
    with pytest.raises(UserError, match=r"missing.py:compute_score'.*no file .*missing.py"):
        references([PromptRow("1+1?", "2")], reward, "d.jsonl")
    assert references([PromptRow("1+1?", "2")], RewardConfig(function=reward.function), "d.jsonl")  # unused


def test_overlong_rows_leave_with_their_references_and_are_counted_in_one_line(tmp_path, capsys):
    from areal_hpc.config.load import load_config
    from areal_hpc.data.chat import load_tokenizer
    from areal_hpc.data.tokenizer import train_tokenizer
    from areal_hpc.runtime.preflight import fitting

    train_tokenizer(["Q: 1+1 = ?\nA: 2", "Q: 2*3 = ?\nA: 6"], 280, tmp_path)
    cfg = load_config("configs/experiments/tiny-cpu.yaml", ["rollout.max_prompt_len=16"])
    rows = [PromptRow("Q: 1+1 = ?\nA:", "2"), PromptRow("Q: " + "1+" * 30 + "1 = ?\nA:", "31"),
            PromptRow("Q: 2*3 = ?\nA:", "6")]
    refs = references(rows, cfg.reward, str(tmp_path / "train.jsonl"))
    kept, ids, kept_refs = fitting(rows, refs, load_tokenizer(tmp_path), cfg, str(tmp_path / "train.jsonl"))
    assert kept == [rows[0], rows[2]] and kept_refs == [MathReference("2"), MathReference("6")] and len(ids) == 2
    assert capsys.readouterr().err == ("rank 0 (controller): train.jsonl: 3 rows, 1 left out: longer than"
                                       " rollout.max_prompt_len = 16 (rows 2)\n")

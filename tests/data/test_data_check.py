"""`areal-hpc data check`: what a launch would read from a data set, and exit 2 on a row it refuses."""

from __future__ import annotations

import json

from chat_data import verl_row, write_verl

from areal_hpc.cli import main

CONFIG = "configs/experiments/tiny-cpu.yaml"


def check(path, tokenizer_dir, *overrides: str) -> int:
    argv = ["data", "check", str(path), "--config", CONFIG, "--tokenizer", str(tokenizer_dir)]
    for o in ("data.layout=verl", *overrides):
        argv += ["--set", o]
    return main(argv)


def test_a_verl_parquet_is_shown_as_the_model_sees_it(tmp_path, chat_tokenizer_dir, capsys):
    rows = [verl_row(0, "Q: 1+2 = ?", "3", system=True)] + [verl_row(i, f"Q: {i}+{i} = ?", str(2 * i)) for i in range(1, 6)]
    rows.append(verl_row(6, "Q: " + "9*" * 80 + "9 = ?", "0", source="long/one"))
    f = write_verl(tmp_path / "train.parquet", rows)
    assert check(f, chat_tokenizer_dir, "reward.by_source={long/one: math}", "rollout.max_prompt_len=64") == 0
    out = capsys.readouterr().out
    assert f"{f}: 7 rows (layout verl: prompt 'prompt', answer 'reward_model.ground_truth')" in out
    first = "SYSTEM: Put the answer in \\boxed{}.\nUSER: Q: 1+2 = ?\nASSISTANT:"
    assert f"as the model sees it:\n{first}\n--- end of prompt" in out
    assert "prompt tokens: min " in out and ", median " in out and ", p95 " in out
    assert "1 left out: longer than rollout.max_prompt_len = 64 (rows 7)" in out
    assert "  openai/gsm8k: 6 rows, math\n  long/one: 1 rows, math" in out
    assert "reward references: all 7 usable; 6 of 7 rows kept" in out


def test_chat_template_kwargs_show_in_the_rendered_prompt(tmp_path, chat_tokenizer_dir, capsys):
    f = write_verl(tmp_path / "d.parquet", [verl_row(0, "Q: 1+2 = ?", "3")])
    assert check(f, chat_tokenizer_dir, "data.chat_template_kwargs={enable_thinking: false}") == 0
    assert "USER: Q: 1+2 = ?\nASSISTANT: /no_think\n--- end of prompt" in capsys.readouterr().out


def test_a_row_the_launch_would_refuse_exits_2_naming_it(tmp_path, chat_tokenizer_dir, capsys):
    tests = json.dumps({"inputs": ["1 2\n"], "outputs": ["3\n"]})
    rows = [verl_row(0, "Q: 1+2 = ?", "3"), verl_row(1, "Add.", tests, source="apps"),
            verl_row(2, "Add again.", '{"inputs": ["1\\n"]}', source="apps")]
    f = write_verl(tmp_path / "mixed.parquet", rows)
    assert check(f, chat_tokenizer_dir, "reward.by_source={apps: code}") == 2
    captured = capsys.readouterr()
    assert "  apps: 2 rows, code\n  openai/gsm8k: 1 rows, math" in captured.out
    assert f"error: {f}: 1 of 3 rows have unusable tests: row 3: missing key 'outputs'" in captured.err


def test_overlong_rows_under_error_and_missing_tokenizer_exit_2(tmp_path, chat_tokenizer_dir, capsys):
    f = write_verl(tmp_path / "d.parquet", [verl_row(0, "Q: 1+2 = ?", "3"), verl_row(1, "Q: " + "1+" * 80 + "1", "81")])
    assert check(f, chat_tokenizer_dir, "data.overlong=error", "rollout.max_prompt_len=64") == 2
    captured = capsys.readouterr()
    assert "prompt tokens: min" in captured.out  # the statistics come before the refusal
    assert f"error: {f}: 1 of 2 prompts are longer than rollout.max_prompt_len = 64 tokens: row 2 (" in captured.err
    assert main(["data", "check", str(f), "--config", CONFIG]) == 2
    assert "error: no tokenizer to render and count the prompts with: pass --tokenizer DIR" in capsys.readouterr().err


def test_chat_rows_with_no_template_exit_2(tmp_path, plain_tokenizer_dir, capsys):
    f = write_verl(tmp_path / "d.parquet", [verl_row(0, "Q: 1+2 = ?", "3")])
    assert check(f, plain_tokenizer_dir) == 2
    assert "row 1: the prompt is a list of chat messages, and the tokenizer" in capsys.readouterr().err

"""Prompts as the model sees them: chat templates (the tokenizer's, a file's, none), their kwargs,
string prompts untouched, and the overlong rule (filter counted, or error naming rows)."""

from __future__ import annotations

import numpy as np
import pytest

from areal_hpc.config.schema import DataConfig
from areal_hpc.data.chat import left_out, load_tokenizer, render
from areal_hpc.errors import DataError
from areal_hpc.prompt_row import PromptRow

SYSTEM_USER = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Q: 1+2 = ?"}]
CHAT = PromptRow(SYSTEM_USER, "3")
TEXT = PromptRow("Q: 4*5 = ?\nA:", "20")


@pytest.fixture(scope="module")
def chat_tok(chat_tokenizer_dir):
    return load_tokenizer(chat_tokenizer_dir)


@pytest.fixture(scope="module")
def plain_tok(plain_tokenizer_dir):
    return load_tokenizer(plain_tokenizer_dir)


def test_chat_messages_render_with_the_tokenizers_template(chat_tok):
    out = render([CHAT, TEXT], chat_tok, DataConfig(), 128, "d.parquet")
    assert out.texts == ["SYSTEM: Be brief.\nUSER: Q: 1+2 = ?\nASSISTANT:", TEXT.prompt]
    assert out.kept == [0, 1] and out.filtered == {}
    for text, ids in zip(out.texts, out.ids, strict=True):
        assert ids.dtype == np.int32 and chat_tok.decode(ids) == text
        assert ids.tolist() == chat_tok(text, add_special_tokens=False)["input_ids"]


@pytest.mark.parametrize("mode", ["auto", "none", "file"])
def test_a_string_prompt_is_used_as_is_in_every_mode(chat_tok, tmp_path, mode):
    if mode == "file":
        (tmp_path / "t.jinja").write_text("NOT USED {{ messages }}")
        mode = str(tmp_path / "t.jinja")
    out = render([TEXT], chat_tok, DataConfig(chat_template=mode), 128, "d.jsonl")
    assert out.texts == [TEXT.prompt]


def test_a_template_file_replaces_the_tokenizers(plain_tok, chat_tok, tmp_path):
    (tmp_path / "mine.jinja").write_text("{% for m in messages %}[{{ m.role }}] {{ m.content }} {% endfor %}=>")
    for tok in (plain_tok, chat_tok):
        out = render([CHAT], tok, DataConfig(chat_template=str(tmp_path / "mine.jinja")), 128, "d")
        assert out.texts == ["[system] Be brief. [user] Q: 1+2 = ? =>"]


def test_template_kwargs_reach_the_template(chat_tok):
    off = DataConfig(chat_template_kwargs={"enable_thinking": False})
    assert render([CHAT], chat_tok, off, 128, "d").texts[0].endswith("ASSISTANT: /no_think")
    on = DataConfig(chat_template_kwargs={"enable_thinking": True})
    assert render([CHAT], chat_tok, on, 128, "d").texts[0].endswith("ASSISTANT:")


def test_chat_rows_without_a_template_are_refused_naming_the_row(plain_tok, chat_tok):
    rows = [TEXT, CHAT]
    with pytest.raises(DataError, match=r"^d\.parquet: row 2: the prompt is a list of chat messages, and the tokenizer"
                                        r" \(.*\) has no chat template; set data\.chat_template to the path of a"
                                        r" \.jinja file"):
        render(rows, plain_tok, DataConfig(), 128, "d.parquet")
    with pytest.raises(DataError, match=r"^d\.parquet: row 2: .*data\.chat_template = none refuses them"):
        render(rows, chat_tok, DataConfig(chat_template="none"), 128, "d.parquet")


def test_a_template_that_fails_names_the_row(chat_tok, tmp_path):
    (tmp_path / "strict.jinja").write_text(
        "{% for m in messages %}{% if m.role == 'system' %}{{ raise_exception('System role not supported') }}"
        "{% endif %}{{ m.content }}{% endfor %}")
    rows = [PromptRow([{"role": "user", "content": "hi"}], "1"), CHAT]
    with pytest.raises(DataError, match=r"d: row 2: the chat template failed on its messages: System role not supported"):
        render(rows, chat_tok, DataConfig(chat_template=str(tmp_path / "strict.jinja")), 128, "d")


def test_overlong_prompts_are_filtered_and_counted_or_refused(chat_tok):
    long = PromptRow("Q: " + "1+" * 60 + "1 = ?\nA:", "61")
    rows = [TEXT, long, CHAT, long]
    n_long = len(chat_tok(long.prompt, add_special_tokens=False)["input_ids"])
    fits = max(len(chat_tok(r, add_special_tokens=False)["input_ids"])
               for r in (TEXT.prompt, "SYSTEM: Be brief.\nUSER: Q: 1+2 = ?\nASSISTANT:"))
    assert fits < n_long
    out = render(rows, chat_tok, DataConfig(), fits, "train.parquet")
    assert out.kept == [0, 2] and len(out.texts) == len(out.ids) == 2
    reason = f"longer than rollout.max_prompt_len = {fits}"
    assert out.filtered == {reason: [2, 4]}
    assert left_out("train.parquet", 4, out.filtered) == f"train.parquet: 4 rows, 2 left out: {reason} (rows 2, 4)"
    with pytest.raises(DataError, match=rf"^train\.parquet: 2 of 4 prompts are {reason} tokens: row 2 \({n_long}"
                                        r" tokens\); row 4 .*set data\.overlong: filter"):
        render(rows, chat_tok, DataConfig(overlong="error"), fits, "train.parquet")
    with pytest.raises(DataError, match=r"^train\.parquet: 2 of 2 prompts are longer .*raise rollout\.max_prompt_len\)"):
        render([long, long], chat_tok, DataConfig(), fits, "train.parquet")
    assert render(rows, chat_tok, DataConfig(overlong="error"), n_long, "t").kept == [0, 1, 2, 3]


def test_the_left_out_line_shows_five_rows_then_dots():
    line = left_out("d.jsonl", 100, {"longer than rollout.max_prompt_len = 8": list(range(1, 40, 3))})
    assert line == "d.jsonl: 100 rows, 13 left out: longer than rollout.max_prompt_len = 8 (rows 1, 4, 7, 10, 13, ...)"


def test_a_directory_that_is_not_a_tokenizer(tmp_path):
    with pytest.raises(DataError, match="not a tokenizer directory"):
        load_tokenizer(tmp_path)

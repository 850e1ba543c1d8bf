"""Prompts as the model sees them: chat messages rendered by a chat template, then token ids, with
the rows longer than rollout.max_prompt_len left out (data.overlong: filter) or refused (error).

A string prompt is used as is in every data.chat_template mode, so data that is already templated
text (AReaL's) and the synthetic task feed the model exactly their text. Chat messages go through
`tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=True, **kwargs)`,
verl's way; the text is then tokenized without adding special tokens (a template writes its own).
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np

from areal_hpc.config.schema import DataConfig
from areal_hpc.errors import DataError
from areal_hpc.prompt_row import PromptRow

if TYPE_CHECKING:
    from transformers import PreTrainedTokenizerBase

# Rows named in an error before the count of the rest.
SHOWN_ROWS = 5
# A prompt text with more characters than this many per token of rollout.max_prompt_len, per
# character of the tokenizer's longest token, is overlong whatever its tokens, and is not tokenized:
# a token stands for at most its own string's characters (a normalizer seldom shrinks text; the
# margin covers it). Tokenizing a 100 MB prompt takes rank 0 over 24 GB.
CHARS_MARGIN = 4
# A tokenizer directory holds at least one of these (fast, slow or sentencepiece tokenizers).
TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "tokenizer.model", "vocab.json", "vocab.txt")


@dataclass(frozen=True)
class RenderedPrompts:
    """The kept rows' prompts: `texts[i]` and `ids[i]` belong to row `kept[i]` of the input."""

    # What the model sees, one per kept row.
    texts: list[str]
    # Their token ids (int32).
    ids: list[np.ndarray]
    # 0-based indices of the kept rows, in order.
    kept: list[int]
    # Why rows were left out -> their 1-based row numbers.
    filtered: dict[str, list[int]]


def load_tokenizer(path: str | Path) -> PreTrainedTokenizerBase:
    """The Hugging Face tokenizer of a model or tokenizer directory. What is not one is named in
    one line before transformers reads it: its own errors for a missing or empty directory speak
    of hub repository ids and slow-tokenizer conversions."""
    from transformers import AutoTokenizer

    path = Path(path)
    if not path.is_dir():
        raise DataError(f"{path}: {'not a directory' if path.exists() else 'no such directory'}"
                        " (a tokenizer is a model's or a tokenizer's directory)")
    if not any((path / name).is_file() for name in TOKENIZER_FILES):
        raise DataError(f"{path}: not a tokenizer directory: none of {', '.join(TOKENIZER_FILES)} in it")
    try:
        return AutoTokenizer.from_pretrained(str(path))
    except (OSError, ValueError) as e:
        raise DataError(f"{path}: transformers cannot load the tokenizer: {' '.join(str(e).split())}") from None


def template_of(tokenizer: PreTrainedTokenizerBase, data: DataConfig) -> str | None:
    """The chat template in effect: the tokenizer's (auto), none, or the text of data.chat_template."""
    if data.chat_template == "none":
        return None
    if data.chat_template == "auto":
        return tokenizer.chat_template or None
    try:
        return Path(data.chat_template).read_text()
    except OSError as e:
        raise DataError(f"data.chat_template = {data.chat_template!r}: cannot read it ({e.strerror})") from None


def _no_template(tokenizer: PreTrainedTokenizerBase, data: DataConfig) -> str:
    if data.chat_template == "none":
        return ("data.chat_template = none refuses them; set data.chat_template: auto (the tokenizer's"
                " template) or the path of a .jinja file")
    return (f"the tokenizer ({tokenizer.name_or_path}) has no chat template; set data.chat_template to the"
            " path of a .jinja file, or use a tokenizer whose directory has one (chat_template.jinja)")


def prompt_texts(rows: list[PromptRow], tokenizer: PreTrainedTokenizerBase, data: DataConfig, what: str) -> list[str]:
    """Each row's prompt text; a chat-message row with no template to render it is a DataError."""
    template = template_of(tokenizer, data)
    texts = []
    for n, row in enumerate(rows, 1):
        if isinstance(row.prompt, str):
            texts.append(row.prompt)
            continue
        if template is None:
            raise DataError(f"{what}: row {n}: the prompt is a list of chat messages, and "
                            + _no_template(tokenizer, data))
        try:
            texts.append(tokenizer.apply_chat_template(row.prompt, tokenize=False, add_generation_prompt=True,
                                                       chat_template=template, **data.chat_template_kwargs))
        except Exception as e:  # jinja2's TemplateError, or whatever the template's code raises
            raise DataError(f"{what}: row {n}: the chat template failed on its messages: {e}") from None
    return texts


def token_ids(texts: list[str], tokenizer: PreTrainedTokenizerBase, max_len: int) -> list[np.ndarray | None]:
    """Each text's token ids (int32); None for a text too long to fit in `max_len` tokens whatever
    they are (CHARS_MARGIN), which is not tokenized."""
    longest = max(map(len, tokenizer.get_vocab()), default=1)
    bound = CHARS_MARGIN * longest * max_len
    fits = [i for i, text in enumerate(texts) if len(text) <= bound]
    out: list[np.ndarray | None] = [None] * len(texts)
    if fits:
        for i, row_ids in zip(fits, tokenizer([texts[i] for i in fits], add_special_tokens=False)["input_ids"],
                              strict=True):
            out[i] = np.asarray(row_ids, dtype=np.int32)
    return out


def lengths_of(ids: list[np.ndarray | None]) -> list[int | None]:
    """Token counts, None where the text was too long to tokenize."""
    return [None if x is None else len(x) for x in ids]


def overlong_reason(max_len: int) -> str:
    return f"longer than rollout.max_prompt_len = {max_len}"


def _size(length: int | None) -> str:
    return "its text alone is too long to fit" if length is None else f"{length} tokens"


def keep_fitting(lengths: list[int | None], max_len: int, data: DataConfig,
                 what: str) -> tuple[list[int], dict[str, list[int]]]:
    """The 0-based rows that fit in max_len tokens (a None length: too long to tokenize), and the
    1-based rows left out by reason. Under data.overlong = error any overlong row is a DataError;
    so is every row overlong."""
    over = [i for i, n in enumerate(lengths) if n is None or n > max_len]
    if over and (data.overlong == "error" or len(over) == len(lengths)):
        named = "; ".join(f"row {i + 1} ({_size(lengths[i])})" for i in over[:SHOWN_ROWS])
        more = f"; and {len(over) - SHOWN_ROWS} more" if len(over) > SHOWN_ROWS else ""
        fix = ("raise rollout.max_prompt_len or set data.overlong: filter to leave them out"
               if len(over) < len(lengths) else "raise rollout.max_prompt_len")
        raise DataError(f"{what}: {len(over)} of {len(lengths)} prompts are {overlong_reason(max_len)} tokens:"
                        f" {named}{more} ({fix})")
    kept = [i for i, n in enumerate(lengths) if n is not None and n <= max_len]
    return kept, ({overlong_reason(max_len): [i + 1 for i in over]} if over else {})


def left_out(what: str, rows: int, filtered: dict[str, list[int]]) -> str:
    """One line on a data set's left-out rows: "train.parquet: 12000 rows, 37 left out: longer than
    rollout.max_prompt_len = 1024 (rows 5, 88, ...)"."""
    said = [f"{len(numbers)} left out: {reason} (rows {', '.join(map(str, numbers[:SHOWN_ROWS]))}"
            + (", ...)" if len(numbers) > SHOWN_ROWS else ")") for reason, numbers in filtered.items()]
    return f"{what}: {rows} rows, " + "; ".join(said)


def render(rows: list[PromptRow], tokenizer: PreTrainedTokenizerBase, data: DataConfig, max_len: int, what: str) -> RenderedPrompts:
    """The prompts of `rows` (named `what` in errors) as the model sees them, overlong rows left out."""
    texts = prompt_texts(rows, tokenizer, data, what)
    ids = token_ids(texts, tokenizer, max_len)
    kept, filtered = keep_fitting(lengths_of(ids), max_len, data, what)
    return RenderedPrompts([texts[i] for i in kept], [ids[i] for i in kept], kept, filtered)

"""Finding the final answer in a model's response to a math problem.

The answer is the content of the last `\\boxed{...}` (or `\\fbox{...}`), with braces matched and
escaped braces `\\{ \\}` kept as text. A response whose last box never closes was cut off mid-answer
and has no answer, rather than a guess from what came before. Without any box, the fallbacks are
the last "answer is X" / "Answer: X" phrase, then the last number in the text: small models (the
CPU profile's synthetic task) often answer that way.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

_BOX = re.compile(r"\\(?:boxed|fbox)\s*")
_PHRASE = re.compile(r"answer\s*(?:is|:)\s*:?\s*(.+)", re.IGNORECASE)
_NUMBER = re.compile(r"-?\d+(?:,\d{3})*(?:\.\d+)?(?:\s*/\s*\d+)?")


@dataclass(frozen=True)
class Extracted:
    # The answer text, or None when there is none.
    answer: str | None
    # How it was found: "boxed", "answer phrase", "last number", "unclosed box" or "none".
    how: str


def _braced(text: str, start: int) -> int | None:
    """Index just past the brace group opening at text[start] == '{', or None if it never closes."""
    depth, i = 0, start
    while i < len(text):
        c = text[i]
        if c == "\\":
            i += 2  # an escaped character, e.g. \{ or \}
            continue
        if c == "{":
            depth += 1
        elif c == "}":
            depth -= 1
            if depth == 0:
                return i + 1
        i += 1
    return None


def last_boxed(text: str) -> Extracted:
    """The content of the last box; `how` is "none" without a box, "unclosed box" if it never closes."""
    matches = list(_BOX.finditer(text))
    if not matches:
        return Extracted(None, "none")
    end = matches[-1].end()
    if end < len(text) and text[end] == "{":
        close = _braced(text, end)
        if close is None:
            return Extracted(None, "unclosed box")
        return Extracted(text[end + 1 : close - 1].strip(), "boxed")
    # TeX's brace-less form takes one token: \boxed 5
    token = re.match(r"[^\s$]+", text[end:])
    return Extracted(token.group(0), "boxed") if token else Extracted(None, "unclosed box")


def _clean_phrase(answer: str) -> str:
    """Drop markdown emphasis, math delimiters and the full stop around a phrase's answer."""
    return answer.lstrip(" *$").rstrip(" *$.")


def extract_answer(text: str) -> Extracted:
    """The final answer of a response (see the module docstring for the order of fallbacks)."""
    boxed = last_boxed(text)
    if boxed.how != "none":
        return boxed
    phrases = _PHRASE.findall(text)
    if phrases:
        answer = _clean_phrase(phrases[-1])
        if answer:
            return Extracted(answer, "answer phrase")
    numbers = _NUMBER.findall(text)
    if numbers:
        return Extracted(numbers[-1], "last number")
    return Extracted(None, "none")

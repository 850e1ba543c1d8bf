"""Finding the final answer in a model's response to a math problem.

The answer is the content of the last `\\boxed{...}` (or `\\fbox{...}`), with braces matched and
escaped braces `\\{ \\}` kept as text. A response whose last box never closes was cut off mid-answer
and has no answer, rather than a guess from what came before. Without any box, the fallbacks that
`reward.math_fallbacks` enables are tried in order:
- "answer_phrase": the last "answer is X" / "Answer: X" phrase, X being the answer itself and not
  the rest of its sentence ("The answer is 42 because it is even." answers 42);
- "last_number": the last number in the text. It rewards any response whose last number happens
  to be right (a truncated or guessing one too), so it is off unless a config asks for it.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import dataclass

_BOX = re.compile(r"\\(?:boxed|fbox)\s*")
_PHRASE = re.compile(r"answer\s*(?:is|:)\s*:?\s*(.+)", re.IGNORECASE)
# Math between unescaped dollar signs (`\\$` is a dollar sign).
_MATH_DELIMITED = re.compile(r"(?<!\\)\$(.+?)(?<!\\)\$")
# Where a phrase's answer ends: a sentence or clause break, or a space before a word of two or
# more letters ("42 because ...", "5 cm"); LaTeX commands and the constants named are math.
_PHRASE_END = re.compile(r"[.;!?](?:\s|$)|,\s+(?=[A-Za-z]{2})|\s+(?!(?:pi|sqrt|infty|inf)\b)[A-Za-z]{2,}")
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


def phrase_answer(rest: str) -> str:
    """The answer at the start of the text after an answer phrase: the first $...$ math if the
    text opens with it, else everything up to the end of the answer's clause."""
    rest = rest.strip().strip("*").strip()
    math = _MATH_DELIMITED.match(rest)
    if math:
        return math.group(1).strip()
    end = _PHRASE_END.search(rest)
    return (rest[: end.start()] if end else rest).strip(" *$,")


def _answer_phrase(text: str) -> Extracted | None:
    phrases = _PHRASE.findall(text)
    answer = phrase_answer(phrases[-1]) if phrases else ""
    return Extracted(answer, "answer phrase") if answer else None


def _last_number(text: str) -> Extracted | None:
    numbers = _NUMBER.findall(text)
    return Extracted(numbers[-1], "last number") if numbers else None


# reward.math_fallbacks names -> how each finds an answer (None: it finds none).
FALLBACKS = {"answer_phrase": _answer_phrase, "last_number": _last_number}


def extract_answer(text: str, fallbacks: Sequence[str] = ("answer_phrase",)) -> Extracted:
    """The final answer of a response: the last box, else the first of `fallbacks` that finds one."""
    boxed = last_boxed(text)
    if boxed.how != "none":
        return boxed
    for name in fallbacks:
        found = FALLBACKS[name](text)
        if found is not None:
            return found
    return Extracted(None, "none")

"""One prompt of a data set as the rest of the run sees it: what data/ loads, reward/ scores and
the controller renders. Its own module below both, so reward/ need not import data/."""

from __future__ import annotations

from dataclasses import dataclass

# A chat message: {"role": ..., "content": ...} (other keys kept for the template).
Message = dict


@dataclass(frozen=True)
class PromptRow:
    # The prompt text, used as is, or chat messages rendered by the chat template (data/chat.py).
    prompt: str | list[Message]
    answer: str
    data_source: str | None = None
    extra_info: dict | None = None

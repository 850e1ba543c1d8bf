"""The responses file of one evaluated data set, OUT/NAME.responses.jsonl: one line per sample with
its verdict, in (prompt, sample) order.

It holds everything the metrics need, so summary.json is computed from these files alone: the
same way for one process and for the shards of a multi-node run (`areal-hpc eval-merge`).
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass
from pathlib import Path

from areal_hpc.errors import UserError
from areal_hpc.evaluation.metrics import Sample

SUFFIX = ".responses.jsonl"


@dataclass(frozen=True)
class Response:
    """One line of the file."""

    # 0-based row of the prompt in its data file.
    prompt: int
    sample: int
    data_source: str | None
    # The reward kind that scored it (reward.by_source, else reward.kind).
    kind: str
    response: str
    # The extracted final answer (math), else None.
    answer: str | None
    reward: float
    # The reward check judged it right (Verdict.correct), whatever the scale of its reward.
    correct: bool
    # The reward service's reason ("correct (boxed: 3)", "wrong answer ...", "2/3 tests passed").
    reason: str
    response_tokens: int
    # vLLM's: "stop" (end of sequence) or "length" (max_new_tokens or the context ran out).
    finish_reason: str

    def sample_of(self) -> Sample:
        return Sample(self.prompt, self.data_source, self.kind, self.correct, self.answer, self.response_tokens)


def file_name(dataset: str, shard: tuple[int, int] = (0, 1)) -> str:
    """NAME.responses.jsonl, or NAME.shard-I-of-N.responses.jsonl for one shard of several."""
    index, count = shard
    return f"{dataset}{SUFFIX}" if count == 1 else f"{dataset}.shard-{index}-of-{count}{SUFFIX}"


def write(path: Path, responses: list[Response]) -> None:
    ordered = sorted(responses, key=lambda r: (r.prompt, r.sample))
    path.write_text("".join(json.dumps(asdict(r), ensure_ascii=False) + "\n" for r in ordered))


def read(path: Path) -> list[Response]:
    out = []
    for n, line in enumerate(path.read_text().splitlines(), 1):
        try:
            out.append(Response(**json.loads(line)))
        except (json.JSONDecodeError, TypeError) as e:
            raise UserError(f"{path}: line {n}: not a response record ({e})") from None
    return out

"""What the reward service scores, and what it answers.

Tasks and verdicts cross a process boundary (the pool's workers), so each converts to and from a
plain JSON object.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass

from areal_hpc.reward.code_tests import TestSuite


@dataclass(frozen=True)
class MathTask:
    """A model response to a math problem and the reference answer of the data set."""

    response: str
    reference: str


@dataclass(frozen=True)
class CodeTask:
    """A model response holding a program (fenced or bare) and the tests it must pass."""

    response: str
    tests: TestSuite


Task = MathTask | CodeTask


@dataclass(frozen=True)
class MathReference:
    """A math prompt's reference answer, as the data set gives it."""

    answer: str

    def task(self, response: str) -> MathTask:
        return MathTask(response, self.answer)


@dataclass(frozen=True)
class CodeReference:
    """A coding prompt's tests, parsed once when the data is loaded (not once per sample)."""

    tests: TestSuite

    def task(self, response: str) -> CodeTask:
        return CodeTask(response, self.tests)


# What a generator needs to score any response to one prompt; built at preflight, sent with the
# prompt's GenerateRequest.
Reference = MathReference | CodeReference


@dataclass(frozen=True)
class Verdict:
    """The reward of one task. `passed`/`total` count test cases (1/1 or 0/1 for math)."""

    reward: float
    passed: int
    total: int
    reason: str

    def to_json(self) -> dict:
        return asdict(self)

    @classmethod
    def from_json(cls, obj: dict) -> Verdict:
        return cls(float(obj["reward"]), int(obj["passed"]), int(obj["total"]), str(obj["reason"]))


def failure(task: Task | None, reward: float, reason: str) -> Verdict:
    """A failing verdict that counts every test case of the task (one for math or no task)."""
    total = len(task.tests.cases) if isinstance(task, CodeTask) else 1
    return Verdict(reward, 0, total, reason)


def task_to_json(task: Task) -> dict:
    if isinstance(task, MathTask):
        return {"kind": "math", "response": task.response, "reference": task.reference}
    return {"kind": "code", "response": task.response, "tests": task.tests.to_json()}


def task_from_json(obj: dict) -> Task:
    if obj["kind"] == "math":
        return MathTask(obj["response"], obj["reference"])
    return CodeTask(obj["response"], TestSuite.from_json(obj["tests"]))

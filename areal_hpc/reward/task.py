"""What the reward service scores, and what it answers.

Tasks and verdicts cross a process boundary (the pool's workers), so each converts to and from a
plain JSON object.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field

from areal_hpc.config.schema import RewardConfig
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


@dataclass(frozen=True)
class CustomTask:
    """The arguments of one call of the user's reward function (reward.function), as verl passes them."""

    response: str
    data_source: str | None
    ground_truth: str
    # The row's extra_info, or {} (verl's functions expect a dict).
    extra_info: dict = field(default_factory=dict)


Task = MathTask | CodeTask | CustomTask


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


@dataclass(frozen=True)
class CustomReference:
    """A prompt scored by the user's reward function: what the function gets besides the response."""

    data_source: str | None
    ground_truth: str
    extra_info: dict = field(default_factory=dict)

    def task(self, response: str) -> CustomTask:
        return CustomTask(response, self.data_source, self.ground_truth, self.extra_info)


# What a generator needs to score any response to one prompt; built at preflight, sent with the
# prompt's GenerateRequest.
Reference = MathReference | CodeReference | CustomReference


def kind_of(data_source: str | None, reward: RewardConfig) -> str:
    """Which reward scores a prompt: its data source's entry in reward.by_source, else reward.kind."""
    return reward.by_source.get(data_source, reward.kind) if data_source is not None else reward.kind


def kinds_in_use(reward: RewardConfig) -> set[str]:
    """Every kind some prompt may be scored by (what the reward workers must be ready for)."""
    return {reward.kind, *reward.by_source.values()}


@dataclass(frozen=True)
class Verdict:
    """The reward of one task. `passed`/`total` count test cases (1/1 or 0/1 for math and custom);
    `metrics` are the other numeric values a custom function returned."""

    reward: float
    passed: int
    total: int
    reason: str
    metrics: dict[str, float] = field(default_factory=dict)
    # The reward service failed (a worker died, hung or could not start; a scoring bug), not the
    # response: the reward says nothing about it, and the sample is left out of training.
    infra: bool = False
    # The response is right: what the accuracy metrics count. The built-in checks' reward is then
    # reward.correct; a custom function's reward is on its own scale (reward/custom.py).
    correct: bool = False

    def to_json(self) -> dict:
        obj = asdict(self)
        if not self.metrics:
            del obj["metrics"]
        if not self.infra:
            del obj["infra"]
        return obj

    @classmethod
    def from_json(cls, obj: dict) -> Verdict:
        metrics = {str(k): float(v) for k, v in obj.get("metrics", {}).items()}
        return cls(float(obj["reward"]), int(obj["passed"]), int(obj["total"]), str(obj["reason"]), metrics,
                   bool(obj.get("infra", False)), bool(obj["correct"]))


def failure(task: Task | None, reward: float, reason: str, infra: bool = False) -> Verdict:
    """A failing verdict that counts every test case of the task (one for math or no task);
    `infra`: the reward service failed, not the response (Verdict.infra)."""
    total = len(task.tests.cases) if isinstance(task, CodeTask) else 1
    return Verdict(reward, 0, total, reason, infra=infra)


def task_to_json(task: Task) -> dict:
    if isinstance(task, MathTask):
        return {"kind": "math", "response": task.response, "reference": task.reference}
    if isinstance(task, CustomTask):
        return {"kind": "custom", **asdict(task)}
    return {"kind": "code", "response": task.response, "tests": task.tests.to_json()}


def task_from_json(obj: dict) -> Task:
    if obj["kind"] == "math":
        return MathTask(obj["response"], obj["reference"])
    if obj["kind"] == "custom":
        return CustomTask(obj["response"], obj["data_source"], obj["ground_truth"], obj["extra_info"])
    return CodeTask(obj["response"], TestSuite.from_json(obj["tests"]))

"""A reward worker process: `python -m areal_hpc.reward.worker PARENT_PID`, driven by the pool.

Protocol, one JSON object per line: the pool sends `{"config": RewardConfig}` and then
`{"id": n, "task": ...}`; the worker answers `{"ready": description}` (or `{"fatal": message}`)
and then `{"id": n, "verdict": ...}`. Scoring runs on the main thread, so math-verify's SIGALRM
timeouts work. Anything a library prints goes to stderr, never into the protocol stream.
"""

from __future__ import annotations

import ctypes
import json
import logging
import os
import signal
import sys
from typing import TextIO

from areal_hpc.config.schema import CodeSandboxConfig, RewardConfig
from areal_hpc.errors import UserError
from areal_hpc.reward.code_check import VerdictMemo, check_code
from areal_hpc.reward.custom import RewardFunction, check_custom, limit_memory, load_function
from areal_hpc.reward.math_check import check_math
from areal_hpc.reward.sandbox import Sandbox
from areal_hpc.reward.task import CustomTask, MathTask, Task, Verdict, failure, kinds_in_use, task_from_json

log = logging.getLogger("areal_hpc.reward.worker")
PR_SET_PDEATHSIG = 1


def config_from_json(obj: dict) -> RewardConfig:
    """The inverse of dataclasses.asdict(RewardConfig), which the pool sends."""
    return RewardConfig(**{**obj, "code": CodeSandboxConfig(**obj["code"])})


class Scorer:
    """Scores tasks in this process; the sandbox is found and the custom function imported on
    first use (or by prepare())."""

    def __init__(self, config: RewardConfig) -> None:
        self.config = config
        self._sandbox: Sandbox | None = None
        self._function: RewardFunction | None = None
        self.memo = VerdictMemo(config.code.reuse_verdicts)

    @property
    def sandbox(self) -> Sandbox:
        if self._sandbox is None:
            self._sandbox = Sandbox.detect(self.config.code)
        return self._sandbox

    @property
    def function(self) -> RewardFunction:
        if self._function is None:
            self._function = load_function(str(self.config.function))
        return self._function

    def prepare(self) -> str:
        """Warm up before serving: math-verify builds its LaTeX parser on first use (about a second),
        and the custom function's module may import much: neither must count against a task's
        time limit. Find the sandbox when the service scores code, so a missing one fails at start."""
        check_math(MathTask("\\boxed{\\frac{1}{2}}", "0.5"), self.config)
        kinds = kinds_in_use(self.config)
        ready = [self.sandbox.describe()] if "code" in kinds else ["math"]
        if "custom" in kinds:  # imported now, not under the first task's time limit
            ready.append(f"custom {self.config.function} (module {self.function.__module__})")
        return ", ".join(ready)

    def score(self, task: Task) -> Verdict:
        if isinstance(task, MathTask):
            return check_math(task, self.config)
        if isinstance(task, CustomTask):
            return check_custom(task, self.function, self.config)
        return check_code(task, self.config, self.sandbox, memo=self.memo)


def _send(out: TextIO, obj: dict) -> None:
    out.write(json.dumps(obj) + "\n")
    out.flush()


def main(argv: list[str]) -> int:
    parent = int(argv[0])
    ctypes.CDLL(None, use_errno=True).prctl(PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0)
    if os.getppid() != parent:  # the pool died before the line above
        return 1
    logging.basicConfig(level=logging.WARNING, format="reward worker %(process)d: %(message)s")
    out = os.fdopen(os.dup(1), "w")
    os.dup2(2, 1)
    config = config_from_json(json.loads(sys.stdin.readline())["config"])
    limit_memory(config.memory_mb)
    scorer = Scorer(config)
    try:
        _send(out, {"ready": scorer.prepare()})
    except UserError as e:
        _send(out, {"fatal": str(e)})
        return 1
    for line in sys.stdin:
        msg = json.loads(line)
        task = None
        try:
            task = task_from_json(msg["task"])
            verdict = scorer.score(task)
        except Exception as e:  # a bug or a library failure must not stop the service
            log.exception("scoring failed")
            verdict = failure(task, config.wrong, f"internal error while scoring: {type(e).__name__}: {e}", infra=True)
        _send(out, {"id": msg["id"], "verdict": verdict.to_json()})
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))

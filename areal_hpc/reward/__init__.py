"""The reward service: math answer verification and sandboxed code execution, scored by an
asynchronous pool of worker processes beside each generator."""

from areal_hpc.reward.code_tests import TestCase, TestSuite, load_tests, parse_tests
from areal_hpc.reward.pool import RewardPool
from areal_hpc.reward.task import CodeTask, MathTask, Task, Verdict

__all__ = ["CodeTask", "MathTask", "RewardPool", "Task", "TestCase", "TestSuite", "Verdict", "load_tests",
           "parse_tests"]

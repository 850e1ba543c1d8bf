"""The reward service: math answer verification, sandboxed code execution and the user's own
reward functions, scored by an asynchronous pool of worker processes beside each generator."""

from areal_hpc.reward.code_tests import TestCase, TestSuite, load_tests, parse_tests
from areal_hpc.reward.pool import RewardPool
from areal_hpc.reward.task import (
    CodeReference,
    CodeTask,
    CustomReference,
    CustomTask,
    MathReference,
    MathTask,
    Reference,
    Task,
    Verdict,
)

__all__ = ["CodeReference", "CodeTask", "CustomReference", "CustomTask", "MathReference", "MathTask", "Reference",
           "RewardPool", "Task", "TestCase", "TestSuite", "Verdict", "load_tests", "parse_tests"]

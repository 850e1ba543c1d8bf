"""`areal-hpc reward math|code|custom`: score one answer, program or response and print the JSON
verdict.

For users debugging a reward: the same checks the pool's workers run, with the limits of the
default (or a given) experiment config. `code` runs every test case rather than stopping at the
first failure, so `passed` counts them all; `custom` calls the function in a child process, as the
launch check does, so that one which exits, crashes or hangs is named rather than ending the command.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

from areal_hpc.config.load import load_config
from areal_hpc.config.schema import RewardConfig
from areal_hpc.errors import UserError
from areal_hpc.reward.code_check import check_code
from areal_hpc.reward.code_tests import load_tests
from areal_hpc.reward.custom import failed, scored
from areal_hpc.reward.math_check import check_math
from areal_hpc.reward.probe import ProbeFailed, check_in_child
from areal_hpc.reward.sandbox import Sandbox
from areal_hpc.reward.task import CodeTask, CustomTask, MathTask, Verdict


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("reward", help="score one answer or program as the reward service would")
    cmds = p.add_subparsers(dest="reward_cmd", required=True)
    math = cmds.add_parser("math", help="verify a final answer against a reference answer")
    math.add_argument("--answer", required=True,
                      help="the response or answer text (the last \\boxed{...} is the answer)")
    math.add_argument("--reference", required=True, help="the reference answer")
    math.set_defaults(func=_math)
    code = cmds.add_parser("code", help="run a program against test cases in the sandbox")
    code.add_argument("--program", required=True, help="Python file, or a response with a fenced block")
    code.add_argument("--tests", required=True,
                      help="JSON tests file: {inputs, outputs[, fn_name]} as in APPS/TACO/LiveCodeBench, "
                           "HumanEval's {test, entry_point} or MBPP's {test_list[, test_setup_code]}")
    code.set_defaults(func=_code)
    custom = cmds.add_parser("custom", help="call a custom reward function as the reward workers do")
    custom.add_argument("--function", required=True, help="module:function or path/to/file.py:function")
    custom.add_argument("--response", required=True, help="the model response (solution_str)")
    custom.add_argument("--ground-truth", required=True, help="the row's answer (ground_truth)")
    custom.add_argument("--data-source", help="the row's data_source (default: none)")
    custom.set_defaults(func=_custom)
    probe = cmds.add_parser("probe", help="the sandbox and limits the reward workers would use on this machine"
                                          " (exit 2 when no sandbox works)")
    probe.set_defaults(func=_probe)
    for cmd in (math, code, custom, probe):
        cmd.add_argument("--config", help="experiment config whose `reward` section to use (default: built-in)")
        cmd.add_argument("--set", dest="overrides", action="append", default=[], metavar="KEY=VALUE",
                         help="dotted override, e.g. --set reward.code.per_test_timeout_s=2 (repeatable)")


def _reward_config(args: argparse.Namespace) -> RewardConfig:
    if args.config:
        return load_config(args.config, args.overrides).reward
    if args.overrides:
        raise UserError("--set needs --config (the overrides apply to that file)")
    return RewardConfig()


def _print(verdict: Verdict) -> int:
    print(json.dumps(verdict.to_json()))
    return 0


def _math(args: argparse.Namespace) -> int:
    return _print(check_math(MathTask(args.answer, args.reference), _reward_config(args)))


def _code(args: argparse.Namespace) -> int:
    config = _reward_config(args)
    try:
        program = Path(args.program).read_text()
    except OSError as e:
        raise UserError(f"{args.program}: cannot read program: {e.strerror}") from None
    tests = load_tests(args.tests)
    verdict = check_code(CodeTask(program, tests), config, Sandbox.detect(config.code), stop_early=False)
    return _print(verdict)


def _custom(args: argparse.Namespace) -> int:
    """The verdict of one call, made in a child process: a function that exits, crashes or hangs
    is named in the verdict's reason, as a call that raises is, and the command lives."""
    config = _reward_config(args)
    task = CustomTask(args.response, args.data_source, args.ground_truth)
    try:
        return _print(scored(args.function, check_in_child(args.function, task, config.timeout_s, config.memory_mb)))
    except ProbeFailed as e:
        return _print(failed(args.function, str(e)))


def _probe(args: argparse.Namespace) -> int:
    """What a reward worker here would isolate programs with and which limits hold, found as the
    workers find it (a probe run of the sandbox); run it on a cluster's rollout node to see which
    memory cgroup (v1, v2 or none) is in force before a job is queued."""
    config = _reward_config(args)
    code = config.code
    sandbox = Sandbox.detect(code)  # SandboxUnavailable (exit 2) names what failed
    print(f"sandbox: {sandbox.describe()}")
    print(f"each program: {code.per_test_timeout_s:g} s per test, {code.total_timeout_s:g} s per suite,"
          f" {code.max_processes} processes, {code.max_output_bytes} bytes of output")
    cap = f"{config.memory_mb} MB each (RLIMIT_DATA)" if config.memory_mb else "none (reward.memory_mb = 0)"
    print(f"reward workers: {config.workers} per generator, memory cap {cap}; each math check or custom call limited to"
          f" {config.timeout_s:g} s")
    return 0

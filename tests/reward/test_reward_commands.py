"""`areal-hpc reward math|code`: JSON verdicts for users, errors as one line with exit code 2."""

from __future__ import annotations

import json
import re
import subprocess
import sys
from pathlib import Path

import pytest

from areal_hpc.cli import main

# A whole experiment (a model shape is required) whose reward section the tests override.
TINY_CPU = Path(__file__).resolve().parents[2] / "configs/experiments/tiny-cpu.yaml"


def run_cli(capsys: pytest.CaptureFixture, *argv: str) -> tuple[int, dict | None, str]:
    code = main(list(argv))
    out, err = capsys.readouterr()
    return code, (json.loads(out) if out.strip() else None), err


def test_math_command(capsys) -> None:
    code, verdict, _ = run_cli(capsys, "reward", "math", "--answer", "thus \\boxed{\\frac{1}{2}}",
                               "--reference", "0.5")
    assert code == 0 and verdict == {"reward": 5.0, "passed": 1, "total": 1, "correct": True,
                                     "reason": "correct (boxed: \\frac{1}{2})"}
    code, verdict, _ = run_cli(capsys, "reward", "math", "--answer", "\\boxed{3", "--reference", "3")
    assert code == 0 and verdict["reward"] == -5.0 and "never closes" in verdict["reason"]


@pytest.mark.parametrize("answer, reference, config, reward", [
    ("\\boxed{\\$18.90}", "18.90", [], 5.0),
    ("The answer is 42 because it is even.", "42", [], 5.0),
    ("so we get 7", "7", ["--config", "configs/experiments/math-1.5b.yaml"], -5.0),
    ("The answer is 7", "7", ["--config", "configs/experiments/math-1.5b.yaml"], -5.0),
    ("so we get 7", "7", ["--config", "configs/experiments/tiny-cpu.yaml", "--set",
                          "reward.math_fallbacks=[last_number]"], 5.0),
])
def test_math_command_currency_phrases_and_fallbacks(capsys, answer, reference, config, reward) -> None:
    code, verdict, _ = run_cli(capsys, "reward", "math", "--answer", answer, "--reference", reference, *config)
    assert code == 0 and verdict["reward"] == reward, verdict


@pytest.fixture
def files(tmp_path: Path) -> dict[str, Path]:
    paths = {
        "good": tmp_path / "good.py",
        "half": tmp_path / "half.md",
        "tests": tmp_path / "tests.json",
        "calls": tmp_path / "calls.json",
    }
    paths["good"].write_text("a, b = map(int, input().split())\nprint(a + b)\n")
    paths["half"].write_text("My answer:\n```python\nprint(3)\n```\n")
    paths["tests"].write_text(json.dumps({"inputs": ["1 2\n", "2 2\n", "0 3\n"], "outputs": ["3", "4", "3"]}))
    paths["calls"].write_text(json.dumps({"fn_name": "add", "inputs": ["1\n2", "5\n5"], "outputs": ["3", "10"]}))
    return paths


def test_code_command_counts_every_case(capsys, files) -> None:
    code, verdict, _ = run_cli(capsys, "reward", "code", "--program", str(files["good"]), "--tests",
                               str(files["tests"]))
    assert code == 0 and verdict == {"reward": 5.0, "passed": 3, "total": 3, "reason": "passed 3/3 tests", "correct": True}
    code, verdict, _ = run_cli(capsys, "reward", "code", "--program", str(files["half"]), "--tests",
                               str(files["tests"]))
    assert code == 0 and (verdict["reward"], verdict["passed"], verdict["total"]) == (-5.0, 2, 3)
    assert verdict["reason"] == "test 2/3: wrong answer: expected '4', got '3'"


def test_code_command_livecodebench_call_tests(capsys, files, tmp_path) -> None:
    program = tmp_path / "add.py"
    program.write_text("class Solution:\n    def add(self, a, b):\n        return a + b\n")
    code, verdict, _ = run_cli(capsys, "reward", "code", "--program", str(program), "--tests", str(files["calls"]))
    assert code == 0 and verdict["reward"] == 5.0 and verdict["passed"] == 2


def test_code_command_config_overrides(capsys, files, tmp_path) -> None:
    config = tmp_path / "exp.yaml"
    config.write_text(f"base: [{TINY_CPU}]\nreward:\n  correct: 1.0\n  wrong: 0.0\n")
    code, verdict, _ = run_cli(capsys, "reward", "code", "--program", str(files["good"]), "--tests",
                               str(files["tests"]), "--config", str(config), "--set", "reward.correct=2.0")
    assert code == 0 and verdict["reward"] == 2.0


@pytest.mark.parametrize(
    "argv, message",
    [
        (["--program", "{missing}", "--tests", "{tests}"], "cannot read program"),
        (["--program", "{good}", "--tests", "{missing}"], "cannot read tests file"),
        (["--program", "{good}", "--tests", "{good}"], "not valid JSON"),
        (["--program", "{good}", "--tests", "{tests}", "--set", "reward.correct=1"], "--set needs --config"),
    ],
)
def test_code_command_user_errors(capsys, files, tmp_path, argv: list[str], message: str) -> None:
    names = {k: str(v) for k, v in files.items()} | {"missing": str(tmp_path / "missing")}
    code, verdict, err = run_cli(capsys, "reward", "code", *(a.format(**names) for a in argv))
    assert code == 2 and verdict is None
    assert err.startswith("error: ") and message in err


def test_installed_command_line(files) -> None:
    proc = subprocess.run([sys.executable, "-m", "areal_hpc.cli", "reward", "code", "--program", str(files["good"]),
                           "--tests", str(files["tests"])], capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr
    assert json.loads(proc.stdout)["passed"] == 3


CUSTOM = """
def score(data_source, solution_str, ground_truth, extra_info=None):
    if data_source == "broken":
        raise KeyError(data_source)
    return {"score": 1.0 if ground_truth in solution_str else 0.0, "chars": len(solution_str)}
"""


def test_custom_command(capsys, tmp_path) -> None:
    fn = tmp_path / "my_reward.py"
    fn.write_text(CUSTOM)
    spec = f"{fn}:score"
    code, verdict, _ = run_cli(capsys, "reward", "custom", "--function", spec, "--response", "it is 12",
                               "--ground-truth", "12", "--data-source", "mine")
    assert code == 0 and verdict == {"reward": 1.0, "passed": 1, "total": 1, "reason": f"score 1 from {spec}",
                                     "metrics": {"chars": 8.0}, "correct": True}
    code, verdict, _ = run_cli(capsys, "reward", "custom", "--function", spec, "--response", "x", "--ground-truth",
                               "12", "--data-source", "broken")
    assert code == 0 and verdict == {"reward": 0.0, "passed": 0, "total": 1, "correct": False,
                                     "reason": f"custom reward function {spec} raised KeyError: 'broken'"}
    config = tmp_path / "exp.yaml"
    config.write_text(f"base: [{TINY_CPU}]\nreward:\n  correct: 7.0\n  wrong: -7.0\n")
    code, verdict, _ = run_cli(capsys, "reward", "custom", "--function", spec, "--response", "12", "--ground-truth",
                               "12", "--config", str(config))
    # The function's own scale: reward.correct and wrong change nothing of its verdicts.
    assert code == 0 and (verdict["reward"], verdict["passed"], verdict["correct"]) == (1.0, 1, True)
    code, verdict, err = run_cli(capsys, "reward", "custom", "--function", f"{fn}:scores", "--response", "12",
                                 "--ground-truth", "12")
    assert code == 2 and verdict is None and err == f"error: reward function '{fn}:scores': {fn} defines no" \
                                                    " function 'scores'\n"



@pytest.mark.parametrize("source, happened", [
    ("import os\ndef score(**kw):\n    os._exit(3)\n", "the process exited with status 3"),
    ("import ctypes\ndef score(**kw):\n    return ctypes.string_at(0)\n", "the process was killed by SIGSEGV"),
    ("import os\nos._exit(4)\n", "the process exited with status 4"),
    ("while True:\n    pass\n", "did not return within 2 s (import and call), and its process was killed"),
    ("import signal\ndef score(**kw):\n    signal.signal(signal.SIGALRM, signal.SIG_IGN)\n    while True:\n"
     "        pass\n", "did not return within 2 s (import and call), and its process was killed"),
    ("def score(**kw):\n    held = []\n    while True:\n        held.append(bytearray(64 << 20))\n",
     "ran out of memory (MemoryError: it allocated past reward.memory_mb)"),
])
def test_a_custom_function_that_ends_or_holds_its_process_is_named_and_the_command_lives(
        capsys, tmp_path, monkeypatch, source, happened) -> None:
    """Exits and crashes at import or call, loops the call's alarm cannot stop, and allocation
    without bound (capped by reward.memory_mb) are the verdict's reason: the function runs in a
    child process, not in the command's."""
    from areal_hpc.reward import probe

    monkeypatch.setattr(probe, "IMPORT_GRACE_S", 1.0)
    fn = tmp_path / "bad_reward.py"
    fn.write_text(source)
    config = tmp_path / "exp.yaml"
    config.write_text(f"base: [{TINY_CPU}]\nreward: {{timeout_s: 1.0, memory_mb: 256}}\n")
    code, verdict, _ = run_cli(capsys, "reward", "custom", "--function", f"{fn}:score", "--response", "12",
                               "--ground-truth", "12", "--config", str(config))
    assert code == 0 and (verdict["reward"], verdict["correct"]) == (0.0, False)
    assert verdict["reason"].startswith(f"custom reward function {fn}:score ") and happened in verdict["reason"]


def test_probe_says_which_sandbox_and_limits_hold_here(capsys, tmp_path) -> None:
    """`areal-hpc reward probe` finds the sandbox as a reward worker does and prints its limits,
    the memory cgroup in force (or why none) among them; with no interpreter to run programs it
    exits 2 naming what failed."""
    config = tmp_path / "exp.yaml"
    config.write_text(f"base: [{TINY_CPU}]\nreward: {{memory_mb: 2048, code: {{memory_mb: 512}}}}\n")
    assert main(["reward", "probe", "--config", str(config)]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert len(lines) == 3 and lines[0].startswith("sandbox: "), lines
    assert re.search(r"memory 512 MB (per run \(cgroup v[12] |per process only \(no memory cgroup: )", lines[0]), lines
    assert lines[1] == "each program: 4 s per test, 30 s per suite, 16 processes, 1048576 bytes of output"
    assert lines[2] == ("reward workers: 1 per generator, memory cap 2048 MB each (RLIMIT_DATA); each math check or"
                        " custom call limited to 10 s")
    assert main(["reward", "probe", "--config", str(config), "--set", f"reward.code.python={tmp_path / 'none'}"]) == 2
    err = capsys.readouterr().err
    assert err == f"error: reward.code.python = '{tmp_path / 'none'}': no executable file there on this node (the" \
                  " interpreter that runs model-written programs)\n", err

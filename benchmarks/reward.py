"""Reward service throughput and latency, and what the code sandbox costs.

Measured:
- math checks/s and code tasks/s through the RewardPool with 1 and 2 workers, in a closed loop
  with as many callers as workers (latency is then the service time, not queueing), with p50/p99
  latency per task. Math responses cycle through the answer forms of the tests (LaTeX fractions,
  percentages, intervals, expressions); code tasks are correct and wrong programs with 5 cases
  each, on the default (auto) sandbox backend; custom-function tasks are a verl-style function
  (the last number of the response against the ground truth), so they measure the service's own
  cost per call;
- assert-style code tasks ("assert" rows): correct and wrong programs against MBPP's and HumanEval's
  shapes of tests, 5 asserts each (one case per assert), on the same backend;
- sandbox overhead: one program with 1 and with 10 test cases, run bare (one `python -I -S`
  process per case, as a plain judge would) and through each sandbox backend that works here
  (each with its run's memory cgroup where one can be made, and bwrap once more without it).

The numbers depend on the machine's load; the JSON records the load average at the start.

Usage: .venv/bin/python benchmarks/reward.py [--quick] [--out benchmarks/results]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from areal_hpc.config.schema import CodeSandboxConfig, RewardConfig
from areal_hpc.reward.code_tests import TestSuite, parse_tests
from areal_hpc.reward.pool import RewardPool
from areal_hpc.reward.sandbox import BACKENDS, Sandbox, SandboxUnavailable
from areal_hpc.reward.task import CodeTask, CustomTask, MathTask, Task

MATH = [
    ("Thus the answer is \\boxed{\\frac{1}{2}}.", "0.5"),
    ("\\boxed{50\\%}", "0.5"),
    ("We find \\boxed{(1, 2]}", "\\left(1,2\\right]"),
    ("\\boxed{x^2+2x+1}", "(x+1)^2"),
    ("\\boxed{\\sqrt{2}/2}", "\\frac{\\sqrt{2}}{2}"),
    ("\\boxed{41}", "42"),
    ("\\boxed{1,000}", "1000"),
    ("\\boxed{\\{1, 2\\}}", "\\{2,1\\}"),
    ("The answer is 12.", "12"),
    ("\\boxed{2\\sqrt{2}}", "2\\sqrt{3}"),
]
ADD = parse_tests({"inputs": [f"{i} {2 * i}\n" for i in range(5)], "outputs": [f"{3 * i}\n" for i in range(5)]})
SORT = parse_tests({"inputs": ["5\n3 1 4 1 5\n", "3\n9 8 7\n", "1\n0\n", "4\n2 2 1 1\n", "2\n-1 1\n"],
                    "outputs": ["1 1 3 4 5", "7 8 9", "0", "1 1 2 2", "-1 1"]})
CALLS = parse_tests({"fn_name": "gcd", "inputs": [[12, 18], [7, 5], [0, 4], [100, 75], [9, 9]],
                     "outputs": [6, 1, 4, 25, 9]})
CODE = [
    ("```python\na, b = map(int, input().split())\nprint(a + b)\n```", ADD),
    ("```python\ninput()\nprint(*sorted(map(int, input().split())))\n```", SORT),
    ("```python\ndef gcd(a, b):\n    while b:\n        a, b = b, a % b\n    return a\n```", CALLS),
    ("```python\nprint(0)\n```", ADD),  # wrong: stops at the first failing case
]
WORDS = ["level", "abc", "", "noon", "ab"]
MBPP_PALINDROME = parse_tests({"test_list": [f"assert is_palindrome({w!r}) == {w == w[::-1]}" for w in WORDS]})
MBPP_MEAN = parse_tests({"test_setup_code": "import math",
                         "test_list": [f"assert math.isclose(mean({xs}), {sum(xs) / len(xs)})"
                                       for xs in ([1, 2], [5], [0.5, 1.5, 4], [-3, 3], [7, 8, 9, 10])]})
HUMANEVAL_SORT = parse_tests({"entry_point": "sort_desc", "test": "def check(candidate):\n" + "".join(
    f"    assert candidate({xs}) == {sorted(xs, reverse=True)}\n" for xs in ([3, 1, 2], [], [5, 5, 1], [-1, 0, 1], [9]))})
ASSERTS = [
    ("```python\ndef is_palindrome(s):\n    return s == s[::-1]\n```", MBPP_PALINDROME),
    ("```python\ndef mean(xs):\n    return sum(xs) / len(xs)\n```", MBPP_MEAN),
    ("```python\ndef sort_desc(xs):\n    return sorted(xs, reverse=True)\n```", HUMANEVAL_SORT),
    ("```python\ndef is_palindrome(s):\n    return True\n```", MBPP_PALINDROME),  # wrong: fails at the second
]
PROGRAM = "a, b = map(int, input().split())\nprint(a + b)\n"
CUSTOM_FUNCTION = """
import re


def compute_score(data_source, solution_str, ground_truth, extra_info=None):
    numbers = re.findall(r"-?\\d+", solution_str)
    return {"score": 1.0 if numbers and numbers[-1] == ground_truth else 0.0, "numbers": len(numbers)}
"""


def _numbered(response: str, tests: TestSuite, i: int) -> tuple[str, TestSuite]:
    """The response with `# i` at the end of its program."""
    body, fence, tail = response.rpartition("```")
    return body + f"# {i}\n" + fence + tail, tests


def _percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, round(q * (len(ordered) - 1)))]


async def _closed_loop(config: RewardConfig, tasks: list[Task]) -> dict:
    """Score every task with `workers` callers, each waiting for its verdict before the next."""
    async with RewardPool(config) as pool:
        for task in tasks[: config.workers * 2]:  # warm up: imports, caches, the first sandbox
            await pool.score(task)
        todo = list(reversed(tasks))
        latencies: list[float] = []

        async def caller() -> None:
            while todo:
                task = todo.pop()
                start = time.perf_counter()
                await pool.score(task)
                latencies.append(time.perf_counter() - start)

        start = time.perf_counter()
        await asyncio.gather(*(caller() for _ in range(config.workers)))
        wall = time.perf_counter() - start
        backend = pool.backend
    return {"tasks": len(tasks), "workers": config.workers, "seconds": wall, "per_s": len(tasks) / wall,
            "p50_ms": 1e3 * _percentile(latencies, 0.5), "p99_ms": 1e3 * _percentile(latencies, 0.99),
            "backend": backend}


def throughput(quick: bool) -> dict:
    n_math, n_code, n_custom = (60, 16, 200) if quick else (600, 120, 2000)
    math_tasks = [MathTask(*MATH[i % len(MATH)]) for i in range(n_math)]
    # Each task's program its own (a comment): copies of one program on one tests object would
    # share one sandbox run (pool.py), and this measures runs.
    code_tasks = [CodeTask(*_numbered(*CODE[i % len(CODE)], i)) for i in range(n_code)]
    assert_tasks = [CodeTask(*_numbered(*ASSERTS[i % len(ASSERTS)], i)) for i in range(n_code)]
    out = {}
    for workers in (1, 2):
        out[f"math x{workers}"] = asyncio.run(_closed_loop(RewardConfig(kind="math", workers=workers), math_tasks))
        out[f"code x{workers}"] = asyncio.run(_closed_loop(RewardConfig(kind="code", workers=workers), code_tasks))
        out[f"assert x{workers}"] = asyncio.run(_closed_loop(RewardConfig(kind="code", workers=workers),
                                                             assert_tasks))
    custom_tasks = [CustomTask(f"step 1 gives {i}, so the answer is {i * 7}", "bench", str(i * 7 + i % 2))
                    for i in range(n_custom)]
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "reward_fn.py"
        path.write_text(CUSTOM_FUNCTION)
        for workers in (1, 2):
            config = RewardConfig(kind="custom", function=f"{path}:compute_score", workers=workers)
            out[f"custom x{workers}"] = asyncio.run(_closed_loop(config, custom_tasks))
    return out


def _suite(cases: int) -> TestSuite:
    return parse_tests({"inputs": [f"{i} {i}\n" for i in range(cases)], "outputs": [str(2 * i) for i in range(cases)]})


def _bare(python: str, suite: TestSuite, program: Path) -> None:
    for case in suite.cases:
        out = subprocess.run([python, "-I", "-S", str(program)], input=case.input, capture_output=True,
                             text=True, timeout=30, check=True).stdout
        assert out.split() == str(case.expected).split()


def overhead(quick: bool) -> dict:
    reps = 8 if quick else 40
    sandboxes = {}
    for backend in BACKENDS:
        try:
            sandboxes[backend] = Sandbox.detect(CodeSandboxConfig(backend=backend))
        except SandboxUnavailable as e:
            print(f"skipping the {backend} backend: {e}", file=sys.stderr)
    # The per-run memory cgroup's cost (make, limit, join, remove), side by side.
    if "bwrap" in sandboxes and sandboxes["bwrap"].cgroup is not None:
        sandboxes["bwrap, no memory cgroup"] = Sandbox.detect(CodeSandboxConfig(backend="bwrap", memory_cgroup="off"))
    python = next(iter(sandboxes.values())).python
    out: dict[str, dict] = {"bare": {}} | {b: {} for b in sandboxes}
    with tempfile.TemporaryDirectory() as tmp:
        program = Path(tmp) / "add.py"
        program.write_text(PROGRAM)
        os.chmod(tmp, 0o755)
        for cases in (1, 10):
            suite = _suite(cases)
            runners = {"bare": lambda s=suite: _bare(python, s, program)}
            for name, sandbox in sandboxes.items():
                runners[name] = lambda sb=sandbox, s=suite: _check(sb.run(PROGRAM, s), len(s.cases))
            times: dict[str, list[float]] = {name: [] for name in runners}
            for fn in runners.values():
                fn()  # warm up
            for _ in range(reps):  # round robin, so changes in the machine's load hit every runner alike
                for name, fn in runners.items():
                    start = time.perf_counter()
                    fn()
                    times[name].append(time.perf_counter() - start)
            for name, t in times.items():
                out[name][f"{cases} cases"] = {"p50_ms": 1e3 * statistics.median(t),
                                               "p99_ms": 1e3 * _percentile(t, 0.99), "reps": reps}
    out["python"] = {"path": python}
    return out


def _check(result, cases: int) -> None:
    assert result.error is None and len(result.cases) == cases, result


def table(report: dict) -> str:
    lines = ["| pool | tasks | tasks/s | p50 ms | p99 ms |", "|---|---|---|---|---|"]
    for name, r in report["throughput"].items():
        lines.append(f"| {name} workers | {r['tasks']} | {r['per_s']:.1f} | {r['p50_ms']:.1f} | {r['p99_ms']:.1f} |")
    lines += ["", f"code sandbox: {report['throughput']['code x1']['backend']}", "",
              "| per program | 1 case p50 ms | 10 cases p50 ms | overhead vs bare, 1 case | 10 cases |",
              "|---|---|---|---|---|"]
    o = report["overhead"]
    bare1, bare10 = o["bare"]["1 cases"]["p50_ms"], o["bare"]["10 cases"]["p50_ms"]
    for name, r in o.items():
        if name == "python":
            continue
        one, ten = r["1 cases"]["p50_ms"], r["10 cases"]["p50_ms"]
        lines.append(f"| {name} | {one:.1f} | {ten:.1f} | {one - bare1:+.1f} ms | {ten - bare10:+.1f} ms |")
    return "\n".join(lines)


def plot(report: dict, path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (ax1, ax2) = plt.subplots(1, 2, figsize=(11, 4))
    t = report["throughput"]
    kinds = list(dict.fromkeys(name.split()[0] for name in t))  # math, code, ...: one bar each per worker count
    width = 0.8 / len(kinds)
    for i, kind in enumerate(kinds):
        offset = (i - (len(kinds) - 1) / 2) * width
        ax1.bar([w + offset for w in (1, 2)], [t[f"{kind} x{w}"]["per_s"] for w in (1, 2)], width, label=kind)
    ax1.set_xticks([1, 2], ["1 worker", "2 workers"])
    ax1.set_ylabel("tasks / s")
    ax1.set_yscale("log")
    ax1.legend()
    ax1.set_title("Pool throughput")
    o = {k: v for k, v in report["overhead"].items() if k != "python"}
    names = list(o)
    for offset, cases in ((-0.2, "1 cases"), (0.2, "10 cases")):
        ax2.bar([i + offset for i in range(len(names))], [o[n][cases]["p50_ms"] for n in names], 0.4,
                label=cases.replace("1 cases", "1 case"))
    ax2.set_xticks(range(len(names)), names)
    ax2.set_ylabel("ms per program (p50)")
    ax2.legend()
    ax2.set_title("Bare run vs sandbox backends")
    fig.suptitle("Reward service" + (" (--quick)" if report["quick"] else ""))
    fig.tight_layout()
    fig.savefig(path, dpi=120)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="a tenth of the tasks, 8 repetitions")
    parser.add_argument("--out", type=Path, default=Path(__file__).parent / "results")
    args = parser.parse_args(argv)
    report = {"quick": args.quick, "load_average": os.getloadavg(), "cpus": os.cpu_count(),
              "throughput": throughput(args.quick), "overhead": overhead(args.quick)}
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "reward.json").write_text(json.dumps(report, indent=2) + "\n")
    plot(report, args.out / "reward.png")
    print(table(report))
    print(f"\nload average at start: {report['load_average'][0]:.1f} on {report['cpus']} CPUs")
    print(f"wrote {args.out / 'reward.json'} and {args.out / 'reward.png'}")
    return 0


if __name__ == "__main__":
    sys.exit(main())

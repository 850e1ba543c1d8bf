"""One call of a custom reward function in a child process of its own.

`python -m areal_hpc.reward.probe` reads one JSON line, `{"function": spec, "timeout_s": t,
"memory_mb": m, "task": CustomTask}`, caps its memory as a reward worker's, imports the function, calls it once and answers one JSON line:
`{"reward": r, "correct": c, "metrics": {...}}` or `{"error": message}`. The callers
(`check_in_child`) are the launch check on rank 0, before any other process starts, and
`areal-hpc reward custom`: a function whose import or call ends its process (os._exit, a segfault
in an extension) or never returns must be named with what happened, not
take the controller or the command down with it. Anything the function prints goes to stderr,
never into the answer.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys

from areal_hpc.errors import UserError
from areal_hpc.reward.custom import CallFailed, Score, call, limit_memory, load_function
from areal_hpc.reward.task import CustomTask, task_from_json, task_to_json

# Seconds the child gets beyond the call's own limit, to start Python and import the function's
# module (the reward workers allow the same for their start).
IMPORT_GRACE_S = 120.0
# Lines of the child's stderr quoted when it ended without answering.
STDERR_LINES = 5


class ProbeFailed(Exception):
    """The function could not be imported or called, or its process ended; the message says how,
    phrased to follow "it" (as CallFailed's)."""


def _ended(returncode: int) -> str:
    if returncode < 0:
        try:
            return f"was killed by {signal.Signals(-returncode).name}"
        except ValueError:
            return f"was killed by signal {-returncode}"
    return f"exited with status {returncode}"


def check_in_child(spec: str, task: CustomTask, timeout_s: float, memory_mb: int) -> Score:
    """What calling `spec` on `task` in a child process (memory capped at `memory_mb`, as in a
    reward worker) returned; raises UserError for an import error (as load_function) and
    ProbeFailed for a call that gave no reward."""
    request = json.dumps({"function": spec, "timeout_s": timeout_s, "memory_mb": memory_mb, "task": task_to_json(task)})
    limit_s = timeout_s + IMPORT_GRACE_S
    try:
        done = subprocess.run([sys.executable, "-m", "areal_hpc.reward.probe"], input=request + "\n",
                              capture_output=True, text=True, timeout=limit_s)
    except subprocess.TimeoutExpired:
        raise ProbeFailed(f"did not return within {limit_s:g} s (import and call),"
                          " and its process was killed") from None
    lines = done.stdout.splitlines()
    if not lines:
        tail = "\n".join(done.stderr.rstrip().splitlines()[-STDERR_LINES:])
        raise ProbeFailed(f"ended its process before returning: the process {_ended(done.returncode)}"
                          " (a reward function must return a number, not exit)" + (f"; its last output:\n{tail}"
                                                                                 if tail else ""))
    reply = json.loads(lines[-1])
    if "import_error" in reply:
        raise UserError(reply["import_error"])
    if "error" in reply:
        raise ProbeFailed(reply["error"])
    return Score(float(reply["reward"]), bool(reply["correct"]), {str(k): float(v) for k, v in reply["metrics"].items()})


def main() -> int:
    out = os.fdopen(os.dup(1), "w")
    os.dup2(2, 1)
    request = json.loads(sys.stdin.readline())
    limit_memory(int(request["memory_mb"]))
    task = task_from_json(request["task"])
    try:
        fn = load_function(request["function"])
    except UserError as e:
        reply: dict = {"import_error": str(e)}
    else:
        try:
            score = call(fn, task, float(request["timeout_s"]))
            reply = {"reward": score.reward, "correct": score.correct, "metrics": score.metrics}
        except CallFailed as e:
            reply = {"error": str(e)}
    out.write(json.dumps(reply) + "\n")
    out.flush()
    return 0


if __name__ == "__main__":
    sys.exit(main())

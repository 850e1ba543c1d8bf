"""The custom reward function of benchmarks/chaos.py's custom-reward fault: 1 when the response's
last number is the reference, else 0; but a share of the calls (CHAOS_REWARD_FAULT_RATE) ends its
process, hangs past its alarm, or allocates without bound, a third each. The launch's own check
calls it with the reference as the response: that call always answers, so the launch goes ahead."""

from __future__ import annotations

import os
import random
import re
import signal

RATE_ENV = "CHAOS_REWARD_FAULT_RATE"


def score(data_source, solution_str, ground_truth, extra_info=None):
    if solution_str != ground_truth:
        draw, rate = random.random(), float(os.environ.get(RATE_ENV, "0"))
        if draw < rate / 3:
            os._exit(7)
        if draw < 2 * rate / 3:
            signal.signal(signal.SIGALRM, signal.SIG_IGN)
            while True:
                pass
        if draw < rate:
            held = []
            while True:
                held.append(bytearray(64 << 20))
    numbers = re.findall(r"-?\d+", solution_str)
    return 1.0 if numbers and numbers[-1] == str(ground_truth).strip() else 0.0

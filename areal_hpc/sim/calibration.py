"""The fitted efficiencies: two parameters fitted by fit.py on the 16k row of the paper's
Figure 4 (1.5B, AReaL and the synchronous system at 32-256 GPUs), and one set a priori.

Training MFU is not fitted: in that row the trainer is idle most of the time (AReaL) or a small
share of each step (synchronous), so the row cannot tell an MFU of 0.2 from 0.6. It is set to 0.40,
the middle of what Megatron-LM reports for dense GPT training on Hopper (roughly 35-50%).
"""

from __future__ import annotations

from areal_hpc.sim.cost_model import Efficiency

A_PRIORI_MFU = 0.40

# Output of `python -m areal_hpc.sim.fit` (held fixed for every prediction).
FITTED = Efficiency(decode=0.0680, step_overhead_s=0.0068, mfu=A_PRIORI_MFU)

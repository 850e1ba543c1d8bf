"""The fitted parameters the simulator predicts with.

FITTED: two efficiencies fitted by fit.py on the 16k row of the paper's Figure 4 (1.5B, AReaL and
the synchronous system at 32-256 GPUs), and one set a priori. Training MFU is not fitted there:
in that row the trainer is idle most of the time (AReaL) or a small share of each step
(synchronous), so the row cannot tell an MFU of 0.2 from 0.6. It is set to 0.40, the middle of
what Megatron-LM reports for dense GPT training on Hopper (roughly 35-50%).

Calibration: every parameter fitted on measured runs of this system (run_fit.py, `areal-hpc sim
fit`), each with the number of points and the residual of its fit; its dict form is the
calibration file, read back by `from_dict`, which names the key of anything malformed.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, fields

from areal_hpc.errors import UserError
from areal_hpc.sim.cost_model import Efficiency
from areal_hpc.sim.lengths import LengthDistribution

A_PRIORI_MFU = 0.40

# Output of `python -m areal_hpc.sim.fit` (held fixed for every prediction).
FITTED = Efficiency(decode=0.0680, step_overhead_s=0.0068, mfu=A_PRIORI_MFU)


class CalibrationError(UserError):
    """A calibration file that is not what `areal-hpc sim fit` writes; the message names the key."""


@dataclass(frozen=True)
class Fitted:
    """One fitted parameter: its value, the points it was fitted on (0: the prior, not fitted),
    and the RMS relative error of its model on those points (None: not defined for it)."""

    value: float
    points: int
    residual: float | None

    @classmethod
    def prior(cls, value: float) -> Fitted:
        return cls(value, 0, None)

    def to_dict(self) -> dict:
        return {"value": float(self.value), "points": int(self.points),
                "residual": None if self.residual is None else float(self.residual)}

    @classmethod
    def from_dict(cls, data: object, key: str) -> Fitted:
        if not isinstance(data, dict):
            raise CalibrationError(f"{key}: expected a mapping with value, points and residual, got {data!r:.60}")
        missing = [k for k in ("value", "points", "residual") if k not in data]
        if missing:
            raise CalibrationError(f"{key}: missing {', '.join(missing)}")
        value, points, residual = data["value"], data["points"], data["residual"]
        if not _number(value) or value < 0:
            raise CalibrationError(f"{key}.value: expected a number >= 0, got {value!r:.60}")
        if not isinstance(points, int) or isinstance(points, bool) or points < 0:
            raise CalibrationError(f"{key}.points: expected an integer >= 0, got {points!r:.60}")
        if residual is not None and (not _number(residual) or residual < 0):
            raise CalibrationError(f"{key}.residual: expected a number >= 0 or null, got {residual!r:.60}")
        return cls(float(value), points, None if residual is None else float(residual))


def _number(x: object) -> bool:
    return isinstance(x, int | float) and not isinstance(x, bool) and math.isfinite(x)


# Parameters that must be positive for the cost model (a zero efficiency divides by zero).
_POSITIVE = ("decode_efficiency", "prefill_mfu", "train_mfu", "length_median")
_AT_MOST_ONE = ("decode_efficiency", "prefill_mfu", "train_mfu", "length_prompt_share")
# Parameters later versions of `sim fit` added: a file written before them reads them as unmeasured.
_ADDED_LATER = {"prompt_len": Fitted.prior(0.0)}


@dataclass(frozen=True)
class Calibration:
    """The simulator's parameters fitted on measured runs, on the hardware preset they ran on."""

    hardware: str
    # The run directories fitted on.
    runs: tuple[str, ...]
    # Efficiency: decode (fraction of the preset's memory bandwidth and peak), its per-step
    # overhead, prefill and training MFU, the fixed seconds of a weight update.
    decode_efficiency: Fitted
    step_overhead_s: Fitted
    prefill_mfu: Fitted
    train_mfu: Fitted
    update_overhead_s: Fitted
    # Seconds from a sample's last token to its reward at the controller.
    reward_s: Fitted
    # Tokens of a prompt, chat template included (0 points: the task's assumption is kept).
    prompt_len: Fitted
    # Log-normal response lengths (lengths.LengthDistribution; the cap is the workload's).
    length_median: Fitted
    length_sigma: Fitted
    length_prompt_share: Fitted
    # Diagnostics, not read back: (mean batch, iterations, measured s, fitted s) per batch class.
    decode_by_batch: tuple[tuple[float, float, float, float], ...] = ()

    @property
    def efficiency(self) -> Efficiency:
        return Efficiency(decode=self.decode_efficiency.value, step_overhead_s=self.step_overhead_s.value,
                          mfu=self.train_mfu.value, prefill_mfu=self.prefill_mfu.value,
                          update_overhead_s=self.update_overhead_s.value)

    def prompt_tokens(self) -> int | None:
        """The measured prompt length, or None where the runs did not measure it."""
        return max(1, round(self.prompt_len.value)) if self.prompt_len.points else None

    def lengths(self, cap: int) -> LengthDistribution:
        return LengthDistribution(self.length_median.value, self.length_sigma.value, cap,
                                  self.length_prompt_share.value)

    @classmethod
    def parameter_names(cls) -> tuple[str, ...]:
        return tuple(f.name for f in fields(cls) if f.type == "Fitted")

    def to_dict(self) -> dict:
        return {
            "hardware": self.hardware,
            "runs": list(self.runs),
            "parameters": {name: getattr(self, name).to_dict() for name in self.parameter_names()},
            "decode_by_batch": [{"batch": float(b), "iterations": int(n), "measured_s": float(m), "fitted_s": float(f)}
                                for b, n, m, f in self.decode_by_batch],
        }

    @classmethod
    def from_dict(cls, data: object) -> Calibration:
        """The calibration a file's YAML holds; CalibrationError names the first bad key."""
        if not isinstance(data, dict):
            raise CalibrationError(f"expected a mapping with hardware, runs and parameters, got {data!r:.60}")
        for key in ("hardware", "runs", "parameters"):
            if key not in data:
                raise CalibrationError(f"missing key '{key}'")
        if not isinstance(data["hardware"], str):
            raise CalibrationError(f"hardware: expected a preset name, got {data['hardware']!r:.60}")
        runs = data["runs"]
        if not isinstance(runs, list) or not all(isinstance(r, str) for r in runs):
            raise CalibrationError(f"runs: expected a list of run directories, got {runs!r:.60}")
        params = data["parameters"]
        if not isinstance(params, dict):
            raise CalibrationError(f"parameters: expected a mapping, got {params!r:.60}")
        values = {}
        for name in cls.parameter_names():
            if name not in params:
                if name in _ADDED_LATER:
                    values[name] = _ADDED_LATER[name]
                    continue
                raise CalibrationError(f"parameters.{name}: missing")
            values[name] = Fitted.from_dict(params[name], f"parameters.{name}")
            if name in _POSITIVE and values[name].value <= 0:
                raise CalibrationError(f"parameters.{name}.value: must be > 0, got {values[name].value}")
            if name in _AT_MOST_ONE and values[name].value > 1:
                raise CalibrationError(f"parameters.{name}.value: must be <= 1, got {values[name].value}")
        return cls(hardware=data["hardware"], runs=tuple(runs), **values)

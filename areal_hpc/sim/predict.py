"""Predictions for the paper's models: load the experiment config, build the layout, check
memory, run the asynchronous or synchronous simulation. What the `areal-hpc sim` commands print."""

from __future__ import annotations

from dataclasses import dataclass, replace
from functools import cache
from pathlib import Path

import numpy as np

from areal_hpc.config.load import load_config
from areal_hpc.config.schema import ExperimentConfig
from areal_hpc.config.validate import CHOICES
from areal_hpc.errors import UserError
from areal_hpc.sim.async_system import run_async
from areal_hpc.sim.calibration import FITTED
from areal_hpc.sim.cost_model import CostModel, Efficiency, ModelShape
from areal_hpc.sim.hardware import H800, Hardware
from areal_hpc.sim.layout import Layout, colocated_layout, make_fleet, memory_plan, split_layout
from areal_hpc.sim.lengths import REASONING, LengthDistribution, LengthStream
from areal_hpc.sim.run import Run
from areal_hpc.sim.sync_system import run_sync
from areal_hpc.sim.workload import Workload, workload_from

CONFIG_DIR = Path(__file__).resolve().parents[2] / "configs" / "experiments"
# The paper's experiment for each model size.
EXPERIMENTS = {"1.5b": "math-1.5b", "7b": "math-7b", "14b": "code-14b", "32b": "code-32b"}
SYSTEMS = ("areal", "sync")
GATES = CHOICES["rollout.staleness_gate"]


@dataclass(frozen=True)
class Fidelity:
    """How many training steps to measure: asynchronous ones after the warm-up (run_async finds
    its end), synchronous ones from the first (they are alike)."""

    steps: int = 8
    sync_steps: int = 2
    seed: int = 1


DEFAULT = Fidelity()
QUICK = Fidelity(steps=4, sync_steps=1)


@cache
def experiment(model: str) -> ExperimentConfig:
    """The paper experiment config of a model size ('1.5b', '7b', '14b', '32b'), or the experiment
    config at a path ending in .yaml (a measured run's, to predict its variants)."""
    if model.endswith((".yaml", ".yml")) and Path(model).is_file():
        return load_config(model, check_files=False)
    if model not in EXPERIMENTS:
        raise UserError(f"unknown model '{model}'; choose one of {', '.join(EXPERIMENTS)} or an experiment .yaml")
    return load_config(CONFIG_DIR / f"{EXPERIMENTS[model]}.yaml", check_files=False)


def layout_for(cfg: ExperimentConfig, gpus: int, system: str) -> Layout:
    if system not in SYSTEMS:
        raise UserError(f"unknown system '{system}'; choose one of {', '.join(SYSTEMS)}")
    if gpus < 1:
        raise UserError(f"GPU count must be positive, got {gpus}")
    return split_layout(cfg, gpus) if system == "areal" else colocated_layout(cfg, gpus)


def workload_for(cfg: ExperimentConfig, layout: Layout, context: int | None = None,
                 lengths: LengthDistribution = REASONING, reward_s: float = 0.0,
                 prompt_len: int | None = None) -> Workload:
    """The config's workload on `layout`: prompts in flight scale with the generator engines, so
    each engine keeps the load the config gives it (the staleness bound still caps the total)."""
    w = workload_from(cfg, context, lengths, reward_s, prompt_len)
    per_engine = cfg.rollout.max_concurrent / cfg.generator.count
    return replace(w, max_concurrent=max(1, round(per_engine * layout.engines)))


@dataclass(frozen=True)
class Prediction:
    """One simulated layout: its run, or why it does not fit in memory."""

    layout: Layout
    workload: Workload
    run: Run | None
    # Out-of-memory reasons; empty when it ran.
    problems: tuple[str, ...] = ()

    @property
    def tokens_per_s(self) -> float | None:
        return None if self.run is None else self.run.tokens_per_s

    def setting(self, with_eta: bool = True) -> str:
        """The layout and the workload it runs, for a table's heading."""
        w = self.workload
        text = (f"{self.layout.describe()}\n  {w.batch_prompts} prompts x {w.group_size} per step, generation "
                f"cap {w.lengths.cap} ({w.lengths.capped_fraction():.0%} of traces reach it)")
        if self.layout.colocated:
            return text + ", the whole batch generated at once"
        eta = "unbounded" if w.eta is None else w.eta
        return (text + (f", eta {eta}" if with_eta else "") + f", {w.staleness_gate} staleness gate, at most"
                f" {w.max_concurrent} prompts in flight")

    def summary(self) -> str:
        """One line for a table: throughput, step rate and idle GPU time, or the memory problem."""
        if self.run is None:
            return "out of memory: " + "; ".join(self.problems)
        r = self.run
        idle = f"GPU idle {r.gpu_idle:.0%}" + ("" if r.colocated else f" (generators {r.gen_idle:.0%}, "
                                                                      f"trainers {r.train_idle:.0%})")
        return f"{r.tokens_per_s / 1e3:7.1f}k tokens/s  {r.steps_per_hour:5.2f} steps/h  {idle}"


def simulate(cfg: ExperimentConfig, layout: Layout, w: Workload, hw: Hardware = H800,
             eff: Efficiency = FITTED, fidelity: Fidelity = DEFAULT) -> Prediction:
    """One run, unless out of memory. Colocated layouts run the synchronous schedule, split ones
    the asynchronous system (with eta = 0: synchronous on split GPUs)."""
    cost = CostModel(ModelShape.from_config(cfg.model), hw, eff)
    plan = memory_plan(layout, cost, w)
    if not plan.fits:
        return Prediction(layout, w, None, plan.problems)
    fleet = make_fleet(layout, cost, plan, w)
    lengths = LengthStream(w.lengths, w.group_size, np.random.default_rng(fidelity.seed))
    if layout.colocated:
        return Prediction(layout, w, run_sync(layout, cost, w, fleet, fidelity.sync_steps, 0, lengths))
    return Prediction(layout, w, run_async(layout, cost, w, fleet, fidelity.steps, lengths))


def scaling(model: str, context: int, gpus: list[int], system: str, hw: Hardware = H800,
            eff: Efficiency = FITTED, fidelity: Fidelity = DEFAULT, lengths: LengthDistribution = REASONING,
            reward_s: float = 0.0, prompt_len: int | None = None) -> list[Prediction]:
    """One prediction per GPU count. `lengths`, `reward_s` and `prompt_len`: see workload_from."""
    cfg = experiment(model)
    out = []
    for n in gpus:
        layout = layout_for(cfg, n, system)
        out.append(simulate(cfg, layout, workload_for(cfg, layout, context, lengths, reward_s, prompt_len), hw, eff,
                            fidelity))
    return out


def _check_eta(eta: int | None) -> None:
    """A staleness bound the simulator can run: None (unbounded) or a whole number >= 0."""
    if eta is not None and eta < 0:
        raise UserError(f"eta must be >= 0, got {eta}")


def hours(model: str, nodes: int, system: str, hw: Hardware = H800, eff: Efficiency = FITTED,
          fidelity: Fidelity = DEFAULT, lengths: LengthDistribution = REASONING,
          reward_s: float = 0.0, prompt_len: int | None = None, context: int | None = None,
          eta: int | None = None) -> Prediction:
    """The paper's Table 3 batch on `nodes` nodes; Run.hours(steps) gives the wall-clock time of a
    training run. `context` (prompt + generation) and `eta` replace the config's: a run's hours
    depend on its generation cap most of all (Table 1's 1.5B runs generated at most 8,192 tokens).
    eta 0 with system 'areal' is the asynchronous system's GPUs run synchronously ("sync AReaL")."""
    if nodes < 1:
        raise UserError(f"--nodes must be positive, got {nodes}")
    _check_eta(eta)
    cfg = experiment(model)
    layout = layout_for(cfg, nodes * hw.gpus_per_node, system)
    w = workload_for(cfg, layout, context, lengths, reward_s, prompt_len)
    return simulate(cfg, layout, w if eta is None else w.with_eta(eta), hw, eff, fidelity)


def staleness(model: str, gpus: int, etas: list[int | None], context: int | None = None,
              hw: Hardware = H800, eff: Efficiency = FITTED, fidelity: Fidelity = DEFAULT,
              gate: str | None = None, lengths: LengthDistribution = REASONING,
              reward_s: float = 0.0, prompt_len: int | None = None) -> list[Prediction]:
    """One asynchronous prediction per staleness bound (None: unbounded); `gate` replaces the
    config's rollout.staleness_gate."""
    for eta in etas:
        _check_eta(eta)
    cfg = experiment(model)
    layout = layout_for(cfg, gpus, "areal")
    w = workload_for(cfg, layout, context, lengths, reward_s, prompt_len)
    if gate is not None:
        if gate not in GATES:
            raise UserError(f"unknown staleness gate '{gate}'; choose one of {', '.join(GATES)}")
        w = w.with_gate(gate)
    return [simulate(cfg, layout, w.with_eta(eta), hw, eff, fidelity) for eta in etas]

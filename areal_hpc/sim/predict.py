"""Predictions for the paper's models: load the experiment config, build the layout, check
memory, run the asynchronous or synchronous simulation. What the `areal-hpc sim` commands print."""

from __future__ import annotations

from dataclasses import dataclass, replace
from functools import cache
from pathlib import Path

import numpy as np

from areal_hpc.config.load import load_config
from areal_hpc.config.schema import ExperimentConfig
from areal_hpc.errors import UserError
from areal_hpc.sim.async_system import run_async
from areal_hpc.sim.calibration import FITTED
from areal_hpc.sim.cost_model import CostModel, Efficiency, ModelShape
from areal_hpc.sim.hardware import H800, Hardware
from areal_hpc.sim.layout import Layout, colocated_layout, make_fleet, memory_plan, split_layout
from areal_hpc.sim.lengths import LengthStream
from areal_hpc.sim.run import Run
from areal_hpc.sim.sync_system import run_sync
from areal_hpc.sim.workload import Workload, workload_from

CONFIG_DIR = Path(__file__).resolve().parents[2] / "configs" / "experiments"
# The paper's experiment for each model size.
EXPERIMENTS = {"1.5b": "math-1.5b", "7b": "math-7b", "14b": "code-14b", "32b": "code-32b"}
SYSTEMS = ("areal", "sync")


@dataclass(frozen=True)
class Fidelity:
    """How many training steps to simulate. The asynchronous pipeline needs a few steps to lose
    its synchronised start, which are discarded; synchronous steps are alike from the first."""

    steps: int = 8
    warmup: int = 4
    sync_steps: int = 2
    seed: int = 1


DEFAULT = Fidelity()
QUICK = Fidelity(steps=5, warmup=2, sync_steps=1)


@cache
def experiment(model: str) -> ExperimentConfig:
    """The paper experiment config of a model size ('1.5b', '7b', '14b', '32b')."""
    if model not in EXPERIMENTS:
        raise UserError(f"unknown model '{model}'; choose one of {', '.join(EXPERIMENTS)}")
    return load_config(CONFIG_DIR / f"{EXPERIMENTS[model]}.yaml", check_files=False)


def layout_for(cfg: ExperimentConfig, gpus: int, system: str) -> Layout:
    if system not in SYSTEMS:
        raise UserError(f"unknown system '{system}'; choose one of {', '.join(SYSTEMS)}")
    if gpus < 1:
        raise UserError(f"GPU count must be positive, got {gpus}")
    return split_layout(cfg, gpus) if system == "areal" else colocated_layout(cfg, gpus)


def workload_for(cfg: ExperimentConfig, layout: Layout, context: int | None = None) -> Workload:
    """The config's workload on `layout`: prompts in flight scale with the generator engines, so
    each engine keeps the load the config gives it (the staleness bound still caps the total)."""
    w = workload_from(cfg, context)
    per_engine = cfg.rollout.max_concurrent / cfg.generator.count
    return replace(w, max_concurrent=max(1, round(per_engine * layout.engines)))


def simulate(cfg: ExperimentConfig, layout: Layout, w: Workload, hw: Hardware = H800,
             eff: Efficiency = FITTED, fidelity: Fidelity = DEFAULT) -> Run | None:
    """One run; None when the layout is out of memory. Colocated layouts run the synchronous
    schedule, split ones the asynchronous system (with eta = 0: synchronous on split GPUs)."""
    cost = CostModel(ModelShape.from_config(cfg.model), hw, eff)
    plan = memory_plan(layout, cost, w)
    if not plan.fits:
        return None
    fleet = make_fleet(layout, cost, plan, w)
    lengths = LengthStream(w.lengths, w.group_size, np.random.default_rng(fidelity.seed))
    if layout.colocated:
        return run_sync(layout, cost, w, fleet, fidelity.sync_steps, 0, lengths)
    return run_async(layout, cost, w, fleet, fidelity.steps, fidelity.warmup, lengths)


def scaling(model: str, context: int, gpus: list[int], system: str, hw: Hardware = H800,
            eff: Efficiency = FITTED, fidelity: Fidelity = DEFAULT) -> list[dict]:
    """Effective throughput at each GPU count; tokens_per_s None when out of memory."""
    cfg = experiment(model)
    out = []
    for n in gpus:
        layout = layout_for(cfg, n, system)
        run = simulate(cfg, layout, workload_for(cfg, layout, context), hw, eff, fidelity)
        out.append({"gpus": n, "tokens_per_s": None if run is None else run.tokens_per_s})
    return out


def hours(model: str, nodes: int, steps: int, system: str, hw: Hardware = H800,
          eff: Efficiency = FITTED, fidelity: Fidelity = DEFAULT) -> float | None:
    """Wall-clock hours of `steps` steps of the paper's Table 3 batch and generation length."""
    if nodes < 1 or steps < 1:
        raise UserError(f"--nodes and --steps must be positive, got {nodes} and {steps}")
    cfg = experiment(model)
    layout = layout_for(cfg, nodes * hw.gpus_per_node, system)
    run = simulate(cfg, layout, workload_for(cfg, layout), hw, eff, fidelity)
    return None if run is None else run.hours(steps)


def staleness(model: str, gpus: int, etas: list[int | None], context: int | None = None,
              hw: Hardware = H800, eff: Efficiency = FITTED, fidelity: Fidelity = DEFAULT) -> list[dict]:
    """Asynchronous throughput at each staleness bound (None: unbounded)."""
    cfg = experiment(model)
    layout = layout_for(cfg, gpus, "areal")
    w = workload_for(cfg, layout, context)
    out = []
    for eta in etas:
        if eta is not None and eta < 0:
            raise UserError(f"eta must be >= 0, got {eta}")
        run = simulate(cfg, layout, w.with_eta(eta), hw, eff, fidelity)
        out.append({"eta": eta, "tokens_per_s": None if run is None else run.tokens_per_s})
    return out

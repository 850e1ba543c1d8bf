"""Where work runs: which GPUs generate, which train and with what parallelism, and whether that
fits in memory. Layouts follow the experiment configs' parallel sizes, scaled to a GPU count."""

from __future__ import annotations

from dataclasses import dataclass

from areal_hpc.config.schema import ExperimentConfig
from areal_hpc.errors import UserError
from areal_hpc.sim.cost_model import CostModel, pipeline_stretch
from areal_hpc.sim.engine import Engine, Fleet
from areal_hpc.sim.memory import (
    REPLICATED_STATE_BYTES,
    SHARDABLE_STATE_BYTES,
    MemoryPlan,
    kv_capacity_tokens,
    train_bytes_per_gpu,
    train_limit_bytes,
)
from areal_hpc.sim.workload import Workload

# The paper gives three quarters of the GPUs to inference.
GEN_FRACTION = 0.75


@dataclass(frozen=True)
class Layout:
    """GPUs of one run. Split: `engines` x `gen_tp` generator GPUs and tp x pp x dp trainer GPUs.
    Colocated (verl-like): every GPU generates, then every GPU trains with FSDP (dp = gpus)."""

    colocated: bool
    gpus: int
    engines: int
    gen_tp: int
    train_tp: int = 1
    train_pp: int = 1
    train_dp: int = 1

    @property
    def gen_gpus(self) -> int:
        return self.engines * self.gen_tp

    @property
    def train_gpus(self) -> int:
        return self.gpus if self.colocated else self.train_tp * self.train_pp * self.train_dp

    def describe(self) -> str:
        if self.colocated:
            return f"{self.gpus} GPUs colocated: {self.engines} engines x tp{self.gen_tp}, FSDP over all"
        return (f"{self.gen_gpus} generator GPUs ({self.engines} x tp{self.gen_tp}) + {self.train_gpus} "
                f"trainer GPUs (tp{self.train_tp} x pp{self.train_pp} x dp{self.train_dp})")

    def train_s(self, cost: CostModel, tokens: float, sq_sum: float, minibatches: int,
                micro_batch_tokens: int) -> float:
        return cost.train_s(tokens, sq_sum, self.train_gpus, self.train_dp, minibatches,
                            self.train_tp * self.train_pp, self.train_pp, micro_batch_tokens)

    def train_procs(self, cost: CostModel, tokens: float, train_s: float, minibatches: int,
                    micro_batch_tokens: int) -> float:
        """Trainer processes busy at once, on average over a step of `train_s` seconds (what a
        shared host's cores see: sim/host.py): all of them but for the pipeline bubbles, in which a
        stage waits, and the collectives' latencies, in which every rank waits."""
        if train_s <= 0.0:
            return float(self.train_gpus)
        comm = cost.train_comm_s(tokens, self.train_gpus, self.train_dp, minibatches, self.train_tp * self.train_pp,
                                 self.train_pp, micro_batch_tokens)
        stretch = pipeline_stretch(self.train_pp, tokens, self.train_dp, minibatches, micro_batch_tokens)
        return self.train_gpus * (train_s - comm) / stretch / train_s

    def update_s(self, cost: CostModel) -> float:
        """New weights into the generators: a broadcast, or a colocated reshard."""
        return cost.reshard_s(self.gpus) if self.colocated else cost.broadcast_s(self.train_pp)


def split_layout(cfg: ExperimentConfig, gpus: int, gen_fraction: float = GEN_FRACTION) -> Layout:
    """The config's engine and trainer shapes, `gen_fraction` of the GPUs generating (the nearest
    split that leaves whole trainer replicas)."""
    gen_tp = cfg.generator.tensor_parallel_size
    replica = cfg.trainer.tp * cfg.trainer.pp
    candidates = [g for g in range(gen_tp, gpus, gen_tp) if (gpus - g) % replica == 0]
    if not candidates:
        raise UserError(f"{gpus} GPUs cannot hold a {gen_tp}-GPU engine and a {replica}-GPU "
                        f"(tp{cfg.trainer.tp} x pp{cfg.trainer.pp}) trainer replica")
    gen = min(candidates, key=lambda g: abs(g - gen_fraction * gpus))
    return Layout(False, gpus, gen // gen_tp, gen_tp, cfg.trainer.tp, cfg.trainer.pp, (gpus - gen) // replica)


def colocated_layout(cfg: ExperimentConfig, gpus: int) -> Layout:
    gen_tp = cfg.generator.tensor_parallel_size
    if gpus % gen_tp:
        raise UserError(f"{gpus} GPUs is not a multiple of the {gen_tp}-GPU engine")
    return Layout(True, gpus, gpus // gen_tp, gen_tp, 1, 1, gpus)


def memory_plan(layout: Layout, cost: CostModel, w: Workload) -> MemoryPlan:
    """KV capacity per engine and trainer peak memory, with the reasons a layout does not fit."""
    shape, hw = cost.shape, cost.hw
    states_per_gpu = (REPLICATED_STATE_BYTES + SHARDABLE_STATE_BYTES) * shape.params / layout.gpus
    resident = states_per_gpu if layout.colocated else 0.0
    kv = kv_capacity_tokens(shape, hw, layout.gen_tp, w.memory_utilization, w.max_num_seqs, resident)
    problems = []
    if kv < w.max_context:
        problems.append(f"a {layout.gen_tp}-GPU engine holds {max(kv, 0)} KV-cache tokens, fewer than "
                        f"one {w.max_context}-token sequence")
    micro_batch = w.max_context if layout.colocated else max(w.micro_batch_tokens, w.max_context)
    train = train_bytes_per_gpu(shape, layout.train_tp, layout.train_pp, layout.train_dp, micro_batch,
                                shard_everything=layout.colocated)
    limit = train_limit_bytes(hw)
    if train > limit:
        problems.append(f"a trainer GPU needs {train / 1e9:.1f} GB for a {micro_batch}-token micro-batch, "
                        f"more than the {limit / 1e9:.1f} GB usable")
    return MemoryPlan(kv, train, tuple(problems))


def make_fleet(layout: Layout, cost: CostModel, plan: MemoryPlan, w: Workload) -> Fleet:
    """The layout's engines; on one shared host (the CPU preset) they record their busy spans."""
    spans = cost.hw.one_host
    return Fleet([Engine(cost, layout.gen_tp, plan.kv_tokens_per_engine, w.max_num_seqs, spans=[] if spans else None)
                  for _ in range(layout.engines)])

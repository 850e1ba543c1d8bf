"""The text of `areal-hpc slurm plan`: which ranks, roles and GPUs sit on every node of the job.

One line per node keeps a 48-node layout readable; `ranks=True` adds one line per rank with the
devices that rank computes on: a trainer's cuda:<GPU> among its node's GPUs, a generator's
CUDA_VISIBLE_DEVICES as the rank sets it at start when SLURM gives every task its node's GPUs
numbered from 0 (wire/layout.py generator_visible_devices).
"""

from __future__ import annotations

from itertools import groupby

from areal_hpc.config.schema import ExperimentConfig
from areal_hpc.rollout import engine_args
from areal_hpc.sim.hardware import H800, Hardware
from areal_hpc.slurm.hetjob import components, placements, spare_component, uses_gpus
from areal_hpc.wire.layout import Placement, Role, generator_visible_devices

PLURAL = {Role.CONTROLLER: "controller", Role.TRAINER: "trainers", Role.GENERATOR: "generators"}


def span(values: list[int]) -> str:
    """Consecutive integers as 'a-b' (or 'a'); anything else as a comma-separated list."""
    if values == list(range(values[0], values[0] + len(values))):
        return f"{values[0]}-{values[-1]}" if len(values) > 1 else str(values[0])
    return ",".join(map(str, values))


def count(n: int, noun: str) -> str:
    return f"{n} {noun}" if n == 1 else f"{n} {noun}s"


def _role_group(group: list[Placement]) -> str:
    role = group[0].role
    name = f"{PLURAL[role] if len(group) > 1 else role.value} {span([p.index for p in group])}"
    if not group[0].gpus:
        return name + (" (no GPU)" if role is Role.CONTROLLER else "")
    if all(len(p.gpus) == 1 for p in group):
        return f"{name} -> GPUs {span([p.gpus[0] for p in group])}, one each"
    return f"{name} -> GPUs " + " | ".join(span(list(p.gpus)) for p in group)


def devices(p: Placement) -> str:
    """What rank `p` computes on, as its process sees it; '-' without a GPU."""
    if not p.gpus:
        return "-"
    if p.role is Role.GENERATOR:
        return f"CUDA_VISIBLE_DEVICES={generator_visible_devices(p, None)}"
    return f"cuda:{p.gpus[0]}"


def node_line(node: int, ranks: list[Placement]) -> str:
    roles = [_role_group(list(g)) for _, g in groupby(ranks, key=lambda p: p.role)]
    return f"  node {node:<3} ranks {span([p.rank for p in ranks]):<9} " + "; ".join(roles)


def memory_lines(cfg: ExperimentConfig, hw: Hardware) -> list[str]:
    """Estimated peak memory of a trainer GPU and a generator GPU (sim/memory.py), from the shards'
    parameters as mapped by `slurm verify`, which checks them against the built shards."""
    from areal_hpc.slurm.verify import mapped_memory

    m, t, gb = mapped_memory(cfg, hw), cfg.trainer, 1e9
    verdict = "fits" if m.train_peak <= m.train_limit else "DOES NOT FIT"
    sequences = m.kv_tokens // m.longest_sequence
    last = f"activations {m.last_stage_activations / gb:.1f} + logits {m.train_logits / gb:.1f}"
    parts = last if t.pp == 1 else (f"max(first stage: activations {m.first_stage_activations / gb:.1f},"
                                    f" last stage: {last})")
    return [
        f"memory (estimate, {hw.name} {hw.hbm_bytes / gb:.0f} GB): trainer GPU {m.train_peak / gb:.1f} GB"
        f" ({verdict} in {m.train_limit / gb:.1f} usable) = states {m.train_states / gb:.1f} + {parts}"
        f" at {t.micro_batch_tokens}-token micro-batches, recompute {t.recompute}, log-probs in chunks of"
        f" {t.logprob_chunk_tokens} tokens",
        f"  generator GPU {m.generator_reserved / gb:.1f} GB reserved by vLLM (gpu_memory_utilization"
        f" {cfg.generator.gpu_memory_utilization}): weights {m.generator_weights / gb:.1f}, KV cache"
        f" {m.kv_tokens} tokens per engine = {sequences} sequences of {m.longest_sequence}",
    ]


def describe(cfg: ExperimentConfig, ranks: bool = False, hw: Hardware = H800) -> str:
    train, rollout = components(cfg)
    placed = placements(cfg)
    nodes = train.nodes + rollout.nodes
    if uses_gpus(cfg):
        head = (f"{cfg.name}: {cfg.world_size} MPI ranks on {nodes} nodes, {train.gpus + rollout.gpus} GPUs"
                f" ({cfg.cluster.gpus_per_node} per node)")
    else:
        head = f"{cfg.name}: {cfg.world_size} MPI ranks on {nodes} nodes, CPU profile (no GPUs)"
    lines = [head]
    roles = {0: f"1 controller + {count(cfg.trainer_world, 'trainer')}",
             1: count(cfg.generator.count, "generator")}
    for c in (train, rollout):
        lines.append(f"component {c.index} (partition {c.partition}): {count(c.nodes, 'node')},"
                     f" {count(c.tasks, 'rank')} ({roles[c.index]}), {count(c.gpus, 'GPU')}")
        mine = [p for p in placed if p.component == c.index]
        for node, group in groupby(mine, key=lambda p: p.node):
            lines.append(node_line(node, list(group)))
    spares = spare_component(cfg)
    if spares:
        lines.append(f"component 2 (partition {spares.partition}): {count(spares.nodes, 'node')},"
                     f" {count(spares.tasks, 'warm spare generator')} outside the MPI world, {count(spares.gpus, 'GPU')}"
                     f" (cluster.spare_nodes; each takes a lost generator's place)")
    if uses_gpus(cfg):
        lines += memory_lines(cfg, hw)
        lines.append("every task sees its node's GPUs; a trainer uses cuda:<its GPU>, a generator sets"
                     " CUDA_VISIBLE_DEVICES to its GPUs at start (--ranks lists each rank's)")
    lines.append(engine_args.describe(engine_args.engine_setup(cfg, "cuda" if uses_gpus(cfg) else "cpu")))
    if ranks:
        lines.append("rank role       index component node gpus  devices")
        lines += [f"{p.rank:<4} {p.role.value:<10} {p.index:<5} {p.component:<9} {p.node:<4} "
                  f"{span(list(p.gpus)) if p.gpus else '-':<5} {devices(p)}" for p in placed]
    return "\n".join(lines)

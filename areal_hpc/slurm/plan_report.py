"""The text of `areal-hpc slurm plan`: which ranks, roles and GPUs sit on every node of the job.

One line per node keeps a 48-node layout readable; `ranks=True` adds one line per rank.
"""

from __future__ import annotations

from itertools import groupby

from areal_hpc.config.schema import ExperimentConfig
from areal_hpc.slurm.hetjob import components, placements, uses_gpus
from areal_hpc.wire.layout import Placement, Role

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


def node_line(node: int, ranks: list[Placement]) -> str:
    roles = [_role_group(list(g)) for _, g in groupby(ranks, key=lambda p: p.role)]
    return f"  node {node:<3} ranks {span([p.rank for p in ranks]):<9} " + "; ".join(roles)


def describe(cfg: ExperimentConfig, ranks: bool = False) -> str:
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
    if ranks:
        lines.append("rank role       index component node gpus")
        lines += [f"{p.rank:<4} {p.role.value:<10} {p.index:<5} {p.component:<9} {p.node:<4} "
                  f"{span(list(p.gpus)) if p.gpus else '-'}" for p in placed]
    return "\n".join(lines)

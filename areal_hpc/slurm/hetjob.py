"""The shape of one experiment's heterogeneous SLURM job: what each component asks SLURM for.

Derived from the rank placement (areal_hpc.wire.layout.plan), never computed separately, so the
sbatch script, `areal-hpc slurm plan` and the launcher agree on every rank's component and node.
"""

from __future__ import annotations

from dataclasses import dataclass

from areal_hpc.config.schema import ExperimentConfig
from areal_hpc.wire.layout import Placement, plan


@dataclass(frozen=True)
class Component:
    """One het-job component: 0 holds the controller and the trainers, 1 the generators, 2 (if
    any) the warm spare generators."""

    index: int
    partition: str
    # MPI ranks on each node of the component, in node order.
    tasks_per_node: tuple[int, ...]
    # GPUs requested per node; 0 on the CPU profile.
    gpus_per_node: int

    @property
    def nodes(self) -> int:
        return len(self.tasks_per_node)

    @property
    def tasks(self) -> int:
        return sum(self.tasks_per_node)

    @property
    def gpus(self) -> int:
        return self.nodes * self.gpus_per_node


def uses_gpus(cfg: ExperimentConfig) -> bool:
    """Whether the job requests GPUs: every profile but `device: cpu` (auto may find GPUs)."""
    return cfg.device != "cpu"


def placements(cfg: ExperimentConfig) -> list[Placement]:
    """Every rank's placement as the job runs it (GPUs assigned unless on the CPU profile)."""
    return plan(cfg, with_gpus=uses_gpus(cfg))


def components(cfg: ExperimentConfig) -> tuple[Component, Component]:
    """Both components, sized from the placements: nodes are those the plan uses."""
    gpn = cfg.cluster.gpus_per_node if uses_gpus(cfg) else 0
    ranks = placements(cfg)
    out = []
    for index, partition in ((0, cfg.cluster.train_partition), (1, cfg.cluster.rollout_partition)):
        nodes = [p.node for p in ranks if p.component == index]
        counts = tuple(nodes.count(n) for n in range(max(nodes) + 1))
        out.append(Component(index, partition, counts, gpn))
    return out[0], out[1]


def spare_component(cfg: ExperimentConfig) -> Component | None:
    """The spares' component (cluster.spare_nodes), outside the MPI world: one spare per engine's
    GPUs of a node, one a node on the CPU profile; None without spare nodes."""
    if not cfg.cluster.spare_nodes:
        return None
    gpn = cfg.cluster.gpus_per_node if uses_gpus(cfg) else 0
    per_node = gpn // cfg.generator.tensor_parallel_size if gpn else 1
    return Component(2, cfg.cluster.rollout_partition, (per_node,) * cfg.cluster.spare_nodes, gpn)

"""Who runs where: the rank -> role -> SLURM component -> node -> GPU map of one experiment.

Pure and computed from the config alone, so the launcher, `areal-hpc slurm plan` and the tests all
agree. GPU indices are node-local positions among the GPUs the job's step gives every task of the
node (SLURM's --gpus-per-node without --gpu-bind: all of them). A trainer uses its one GPU as
cuda:<index> (`trainer_cuda_device`, called by trainer/parallel.py); a generator narrows CUDA_VISIBLE_DEVICES to its GPUs before
anything in its process initialises CUDA (`generator_visible_devices`), so each vLLM engine starts
on its own GPUs. Order of MPI ranks (as `srun --het-group=0,1` numbers them): rank 0 the controller, then
the trainer ranks, all in component 0 (training partition); then the generator ranks in
component 1 (rollout partition). Trainer rank r is (tp, pp, dp) position r of Megatron's order
(`replica_ranks`).
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import StrEnum

from areal_hpc.config.schema import ExperimentConfig
from areal_hpc.errors import ConfigError

CONTROLLER_RANK = 0


class Role(StrEnum):
    CONTROLLER = "controller"
    TRAINER = "trainer"
    GENERATOR = "generator"


@dataclass(frozen=True)
class Placement:
    rank: int
    role: Role
    # Index among the ranks of the same role (trainer rank in the trainer group, generator index).
    index: int
    # SLURM het-job component: 0 = training partition, 1 = rollout partition.
    component: int
    # Node index within the component.
    node: int
    # GPU indices on that node (empty for the controller and for the CPU profile).
    gpus: tuple[int, ...]


def role_of(cfg: ExperimentConfig, rank: int) -> tuple[Role, int]:
    """The role of an MPI rank and its index among ranks of that role."""
    if rank == CONTROLLER_RANK:
        return Role.CONTROLLER, 0
    if rank <= cfg.trainer_world:
        return Role.TRAINER, rank - 1
    if rank < cfg.world_size:
        return Role.GENERATOR, rank - 1 - cfg.trainer_world
    raise ValueError(f"rank {rank} is outside the world of {cfg.world_size} ranks")


def trainer_ranks(cfg: ExperimentConfig) -> list[int]:
    return list(range(1, 1 + cfg.trainer_world))


def replica_ranks(cfg: ExperimentConfig) -> list[list[int]]:
    """The world ranks of each data-parallel replica's trainers (its tp x pp ranks), ascending; the
    first is the replica's root, which takes the controller's commands for it.

    Megatron's default order "tp-cp-ep-dp-pp" (cp = ep = 1 here) puts trainer r at
    tp_rank + tp * (dp_rank + dp * pp_rank), so replica d holds tp consecutive ranks per stage.
    """
    t = cfg.trainer
    first = trainer_ranks(cfg)[0]
    return [[first + tp_rank + t.tp * (d + t.dp * pp_rank) for pp_rank in range(t.pp) for tp_rank in range(t.tp)]
            for d in range(t.dp)]


def generator_ranks(cfg: ExperimentConfig) -> list[int]:
    return list(range(1 + cfg.trainer_world, cfg.world_size))


def trainer_gpu(cfg: ExperimentConfig, index: int) -> tuple[int, int]:
    """Trainer `index`'s node and its GPU there: the trainers fill the training nodes' GPUs in order."""
    return divmod(index, cfg.cluster.gpus_per_node)


def trainer_task(cfg: ExperimentConfig, index: int) -> int:
    """Trainer `index`'s task number on its node, as srun numbers a node's tasks (SLURM_LOCALID):
    its GPU, after the controller (rank 0) on the first node. Not the GPU itself on that node."""
    node, gpu = trainer_gpu(cfg, index)
    return gpu + 1 if node == 0 else gpu


def trainer_cuda_device(cfg: ExperimentConfig, index: int, visible: int) -> int:
    """The CUDA device of trainer `index` among the `visible` devices of its process: its GPU of
    the plan; 0 when the launcher gave the task that one GPU alone (e.g. srun --gpus-per-task=1)."""
    _, gpu = trainer_gpu(cfg, index)
    if visible == 1:
        return 0
    if gpu >= visible:
        raise ConfigError(f"trainer {index} (MPI rank {index + 1}) needs GPU {gpu} of its node"
                          f" (cluster.gpus_per_node = {cfg.cluster.gpus_per_node}) but sees only {visible} CUDA"
                          " devices")
    return gpu


def check_trainer_task(cfg: ExperimentConfig, index: int, local_id: str | None) -> None:
    """Refuse trainer `index` if srun made it another task of its node than the plan's
    (`local_id`: SLURM_LOCALID, None outside SLURM): its GPU of the plan would be another task's."""
    task = trainer_task(cfg, index)
    if local_id is not None and int(local_id) != task:
        _, gpu = trainer_gpu(cfg, index)
        raise ConfigError(f"trainer {index} (MPI rank {index + 1}) is task {local_id} of its node but the rank"
                          f" plan makes it task {task} (GPU {gpu}): the job's placement differs from"
                          " `areal-hpc slurm plan`")


def plan(cfg: ExperimentConfig, with_gpus: bool = True) -> list[Placement]:
    """Placement of every rank. Without GPUs (CPU profile) all ranks share one node per component."""
    gpn = cfg.cluster.gpus_per_node
    tp_gen = cfg.generator.tensor_parallel_size
    out = [Placement(CONTROLLER_RANK, Role.CONTROLLER, 0, 0, 0, ())]
    for i, rank in enumerate(trainer_ranks(cfg)):
        node, local = trainer_gpu(cfg, i) if with_gpus else (0, 0)
        out.append(Placement(rank, Role.TRAINER, i, 0, node, (local,) if with_gpus else ()))
    per_node = gpn // tp_gen if with_gpus else 1
    for i, rank in enumerate(generator_ranks(cfg)):
        node, slot = divmod(i, per_node) if with_gpus else (0, 0)
        gpus = tuple(range(slot * tp_gen, (slot + 1) * tp_gen)) if with_gpus else ()
        out.append(Placement(rank, Role.GENERATOR, i, 1, node, gpus))
    return out


def generator_visible_devices(p: Placement, inherited: str | None) -> str | None:
    """CUDA_VISIBLE_DEVICES for generator placement `p`, given the value the rank inherited.

    None when the rank has no GPUs (CPU profile). Unset or empty: the node's GPUs are numbered
    from 0, so the plan's indices are the devices. A list of exactly the engine's size: the
    launcher bound the task already (e.g. srun --gpus-per-task), kept as is. Any other list: the
    plan's indices are positions in it (SLURM names the node's GPUs of the step, which may be
    UUIDs or a subset of the physical ones).
    """
    if not p.gpus:
        return None
    if not inherited:
        return ",".join(map(str, p.gpus))
    seen = inherited.split(",")
    if len(seen) == len(p.gpus):
        return inherited
    if max(p.gpus) >= len(seen):
        raise ConfigError(
            f"generator {p.index} (MPI rank {p.rank}) needs GPUs {','.join(map(str, p.gpus))} of its node"
            f" (cluster.gpus_per_node, generator.tensor_parallel_size) but sees only"
            f" CUDA_VISIBLE_DEVICES={inherited}"
        )
    return ",".join(seen[g] for g in p.gpus)

"""A trainer's CUDA device is its GPU of the rank plan, by the one rule `slurm plan` prints, and
srun's node-local task number is checked against the plan's."""

from __future__ import annotations

import pytest

from areal_hpc.config.load import load_config
from areal_hpc.errors import ConfigError
from areal_hpc.slurm.hetjob import components, placements
from areal_hpc.wire.layout import Role, check_trainer_task, trainer_cuda_device, trainer_task


@pytest.mark.parametrize("name", ["math-1.5b", "code-14b", "code-32b"])
def test_each_trainer_computes_on_its_gpu_of_the_plan(name: str) -> None:
    """With every GPU of its node visible (the job script's srun), each trainer takes the plan's GPU,
    and the trainers of a node use each GPU once."""
    cfg = load_config(f"configs/experiments/{name}.yaml")
    gpn = cfg.cluster.gpus_per_node
    per_node: dict[int, list[int]] = {}
    for p in placements(cfg):
        if p.role is Role.TRAINER:
            device = trainer_cuda_device(cfg, p.index, gpn)
            assert (device,) == p.gpus
            per_node.setdefault(p.node, []).append(device)
    assert len(per_node) == cfg.cluster.train_nodes
    assert all(sorted(devices) == list(range(gpn)) for devices in per_node.values())


def test_task_numbers_are_srun_block_order_with_the_controller_first() -> None:
    """SLURM_LOCALID as the plan expects it: the controller is task 0 of the first training node,
    so its trainers are tasks 1..8 there (not their GPUs), 0..7 on every other node."""
    cfg = load_config("configs/experiments/code-32b.yaml")
    placed = placements(cfg)
    train, _ = components(cfg)
    for p in placed:
        if p.role is Role.TRAINER:
            before = sum(1 for q in placed if (q.component, q.node) == (p.component, p.node) and q.rank < p.rank)
            assert trainer_task(cfg, p.index) == before
    assert [trainer_task(cfg, i) for i in (0, 7, 8, 15)] == [1, 8, 0, 7]
    assert train.tasks_per_node[:2] == (9, 8)


def test_the_plan_not_the_device_count_decides() -> None:
    """Eight GPUs visible on nodes the config gives four each: trainer 5 is node 1's GPU 1, not
    cuda:5 (rank % device_count); one GPU visible: the launcher bound the task to it."""
    cfg = load_config("configs/experiments/math-1.5b.yaml", ["cluster.gpus_per_node=4", "cluster.train_nodes=8",
                                                             "cluster.rollout_nodes=24"])
    assert trainer_cuda_device(cfg, 5, 8) == 1
    assert trainer_cuda_device(cfg, 5, 1) == 0
    with pytest.raises(ConfigError, match=r"trainer 7 \(MPI rank 8\) needs GPU 3 of its node .* sees only 2 CUDA"):
        trainer_cuda_device(cfg, 7, 2)


def test_a_trainer_placed_elsewhere_than_the_plan_is_refused() -> None:
    cfg = load_config("configs/experiments/code-32b.yaml")
    check_trainer_task(cfg, 0, "1")
    check_trainer_task(cfg, 8, "0")
    check_trainer_task(cfg, 0, None)  # outside SLURM (mpiexec): nothing to check
    with pytest.raises(ConfigError, match=r"trainer 0 \(MPI rank 1\) is task 0 of its node but the rank plan makes"
                                          r" it task 1 \(GPU 0\)"):
        check_trainer_task(cfg, 0, "0")

"""A generator rank narrows CUDA_VISIBLE_DEVICES to its GPUs of the rank plan before vLLM starts."""

from __future__ import annotations

import pytest

from areal_hpc.config.load import load_config
from areal_hpc.errors import ConfigError
from areal_hpc.runtime.generator_rank import bind_gpus
from areal_hpc.slurm.hetjob import placements
from areal_hpc.wire.layout import Role

NODE = ",".join(map(str, range(8)))  # what srun gives every task of a node with --gpus-per-node=8


@pytest.mark.parametrize("name", ["math-1.5b", "code-14b", "code-32b"])
def test_engines_of_a_node_get_disjoint_gpus(name: str) -> None:
    """Each generator, starting from what SLURM gives every task of its node, ends with its own
    GPUs: together the engines of a node use each GPU exactly once."""
    cfg = load_config(f"configs/experiments/{name}.yaml")
    tp = cfg.generator.tensor_parallel_size
    per_node: dict[int, list[str]] = {}
    for p in placements(cfg):
        if p.role is Role.GENERATOR:
            env = {"CUDA_VISIBLE_DEVICES": NODE, "SLURM_LOCALID": str(p.index % (8 // tp))}
            assert bind_gpus(cfg, p.index, env) == env["CUDA_VISIBLE_DEVICES"]
            per_node.setdefault(p.node, []).extend(env["CUDA_VISIBLE_DEVICES"].split(","))
    assert len(per_node) == cfg.cluster.rollout_nodes
    assert all(sorted(gpus) == NODE.split(",") for gpus in per_node.values())


def test_second_engine_of_a_32b_node() -> None:
    cfg = load_config("configs/experiments/code-32b.yaml")
    env = {"CUDA_VISIBLE_DEVICES": NODE}
    assert bind_gpus(cfg, 1, env) == "4,5,6,7" and env["CUDA_VISIBLE_DEVICES"] == "4,5,6,7"
    # Without SLURM's variable (mpiexec on a workstation), the plan's indices are the devices.
    env = {}
    assert bind_gpus(cfg, 3, env) == "4,5,6,7"
    # SLURM may name the node's GPUs by UUID or give the step a subset: positions in its list.
    uuids = ",".join(f"GPU-{i:02d}" for i in range(8))
    env = {"CUDA_VISIBLE_DEVICES": uuids}
    assert bind_gpus(cfg, 1, env) == "GPU-04,GPU-05,GPU-06,GPU-07"
    # A launcher that bound the task already (srun --gpus-per-task=4) is kept.
    env = {"CUDA_VISIBLE_DEVICES": "4,5,6,7"}
    assert bind_gpus(cfg, 1, env) == "4,5,6,7"


def test_a_placement_that_differs_from_the_plan_is_refused() -> None:
    cfg = load_config("configs/experiments/code-32b.yaml")
    env = {"CUDA_VISIBLE_DEVICES": NODE, "SLURM_LOCALID": "0"}
    with pytest.raises(ConfigError, match="generator 1 .* is task 0 of its node but the rank plan puts it in slot 1"):
        bind_gpus(cfg, 1, env)
    assert env["CUDA_VISIBLE_DEVICES"] == NODE
    env = {"CUDA_VISIBLE_DEVICES": "0,1"}
    with pytest.raises(ConfigError, match=r"needs GPUs 4,5,6,7 of its node .* sees only CUDA_VISIBLE_DEVICES=0,1"):
        bind_gpus(cfg, 1, env)


def test_cpu_profile_leaves_the_environment_alone() -> None:
    cfg = load_config("configs/experiments/tiny-cpu.yaml", ["device=cpu"])
    env = {"CUDA_VISIBLE_DEVICES": NODE}
    assert bind_gpus(cfg, 0, env) is None
    assert env == {"CUDA_VISIBLE_DEVICES": NODE}

"""`areal-hpc slurm plan`: the rank -> component -> node -> GPU map of the paper's layouts."""

from __future__ import annotations

import re

import pytest

from areal_hpc.cli import main
from areal_hpc.config.load import load_config
from areal_hpc.slurm.hetjob import components, placements
from areal_hpc.wire.layout import Role

# The paper's runs: nodes in all, a quarter of them training, engines' tensor-parallel size.
PAPER = [("math-1.5b", 16, 1), ("math-7b", 24, 1), ("code-14b", 32, 2), ("code-32b", 48, 4)]


@pytest.mark.parametrize("name,nodes,gen_tp", PAPER)
def test_paper_layout_counts(name: str, nodes: int, gen_tp: int) -> None:
    cfg = load_config(f"configs/experiments/{name}.yaml")
    train, rollout = components(cfg)
    assert (train.nodes, rollout.nodes) == (nodes // 4, 3 * nodes // 4)
    assert (train.gpus, rollout.gpus) == (nodes * 8 // 4, 3 * nodes * 8 // 4)
    # Component 0: every training GPU has a trainer rank, plus the controller on the first node.
    assert train.tasks == train.gpus + 1
    assert train.tasks_per_node == (9,) + (8,) * (train.nodes - 1)
    assert rollout.tasks == rollout.gpus // gen_tp
    assert set(rollout.tasks_per_node) == {8 // gen_tp}
    ranks = placements(cfg)
    assert [p.rank for p in ranks] == list(range(cfg.world_size))
    assert ranks[0].role is Role.CONTROLLER and ranks[0].gpus == ()
    # No GPU is given twice on one node of one component.
    used = [(p.component, p.node, g) for p in ranks for g in p.gpus]
    assert len(used) == len(set(used)) == train.gpus + rollout.gpus


def test_plan_prints_the_48_node_layout(capsys: pytest.CaptureFixture) -> None:
    assert main(["slurm", "plan", "configs/experiments/code-32b.yaml"]) == 0
    out = capsys.readouterr().out
    assert out.splitlines()[0] == "code-32b: 169 MPI ranks on 48 nodes, 384 GPUs (8 per node)"
    assert "component 0 (partition train): 12 nodes, 97 ranks (1 controller + 96 trainers), 96 GPUs" in out
    assert "component 1 (partition rollout): 36 nodes, 72 ranks (72 generators), 288 GPUs" in out
    node_lines = [line for line in out.splitlines() if line.startswith("  node ")]
    assert len(node_lines) == 48
    assert re.match(r"  node 0 +ranks 0-8 +controller 0 \(no GPU\); trainers 0-7 -> GPUs 0-7, one each$",
                    node_lines[0])
    assert re.match(r"  node 35 +ranks 167-168 +generators 70-71 -> GPUs 0-3 \| 4-7$", node_lines[-1])


def test_plan_ranks_table(capsys: pytest.CaptureFixture) -> None:
    assert main(["slurm", "plan", "configs/experiments/code-14b.yaml", "--ranks"]) == 0
    rows = capsys.readouterr().out.split("rank role")[1].splitlines()[1:]
    assert len(rows) == 161
    assert rows[0].split() == ["0", "controller", "0", "0", "0", "-", "-"]
    assert rows[9].split() == ["9", "trainer", "8", "0", "1", "0", "cuda:0"]
    assert rows[-2].split() == ["159", "generator", "94", "1", "23", "4-5", "CUDA_VISIBLE_DEVICES=4,5"]
    assert rows[-1].split() == ["160", "generator", "95", "1", "23", "6-7", "CUDA_VISIBLE_DEVICES=6,7"]


def test_plan_shows_the_devices_every_generator_sets(capsys: pytest.CaptureFixture) -> None:
    """The devices column is what the generator ranks apply: per node, the engines' device lists
    are disjoint and cover the node's GPUs."""
    assert main(["slurm", "plan", "configs/experiments/code-32b.yaml", "--ranks"]) == 0
    out = capsys.readouterr().out
    assert "a generator sets CUDA_VISIBLE_DEVICES to its GPUs at start" in out
    rows = [r.split() for r in out.split("rank role")[1].splitlines()[1:]]
    by_node: dict[str, list[str]] = {}
    for _, role, _, _, node, _, seen in rows:
        if role == "generator":
            by_node.setdefault(node, []).append(seen.removeprefix("CUDA_VISIBLE_DEVICES="))
    assert len(by_node) == 36
    assert all(v == ["0,1,2,3", "4,5,6,7"] for v in by_node.values())


def test_plan_cpu_profile(capsys: pytest.CaptureFixture) -> None:
    assert main(["slurm", "plan", "configs/experiments/tiny-cpu.yaml"]) == 0
    out = capsys.readouterr().out
    assert "3 MPI ranks on 2 nodes, CPU profile (no GPUs)" in out
    assert "node 0   ranks 2         generator 0" in out


@pytest.mark.parametrize(
    "overrides,message",
    [
        # 8 GPUs per node cannot hold engines of 3 GPUs.
        (["generator.tensor_parallel_size=3", "generator.count=96"],
         "generator.tensor_parallel_size = 3: must divide cluster.gpus_per_node = 8"),
        # Too few training nodes for tp x pp x dp.
        (["cluster.train_nodes=3"], "must equal the training GPUs (cluster.train_nodes * cluster.gpus_per_node = 24)"),
        # Too few rollout nodes for the engines.
        (["cluster.rollout_nodes=10"], "must equal the rollout GPUs (cluster.rollout_nodes * cluster.gpus_per_node = 80)"),
    ],
)
def test_bad_layout_fails_clearly(capsys: pytest.CaptureFixture, overrides: list[str], message: str) -> None:
    args = ["slurm", "plan", "configs/experiments/math-1.5b.yaml"]
    for o in overrides:
        args += ["--set", o]
    assert main(args) == 2
    captured = capsys.readouterr()
    assert captured.out == ""
    assert captured.err.startswith("error: ") and message in captured.err and "Traceback" not in captured.err


def test_plan_prints_the_estimated_memory_of_both_kinds_of_gpu(capsys: pytest.CaptureFixture) -> None:
    assert main(["slurm", "plan", "configs/experiments/code-32b.yaml"]) == 0
    out = capsys.readouterr().out
    trainer = re.search(r"memory \(estimate, H800 80 GB\): trainer GPU ([\d.]+) GB \(fits in 76.0 usable\)"
                        r" = states ([\d.]+) \+ max\(first stage: activations ([\d.]+), last stage: activations"
                        r" ([\d.]+) \+ logits ([\d.]+)\) at 32768-token micro-batches, recompute full", out)
    assert trainer, out
    peak, states, first, last, logits = map(float, trainer.groups())
    assert peak == pytest.approx(states + max(first, last + logits), abs=0.15)
    assert re.search(r"generator GPU 68.0 GB reserved by vLLM \(gpu_memory_utilization 0.85\): weights 16.4,"
                     r" KV cache \d+ tokens per engine = \d+ sequences of 28672", out)
    # without recomputation the 32B trainer does not fit; an H200 is named when asked for
    assert main(["slurm", "plan", "configs/experiments/code-32b.yaml", "--set", "trainer.recompute=none",
                 "--gpu", "h200"]) == 0
    assert "(estimate, H200 141 GB)" in (out := capsys.readouterr().out) and "DOES NOT FIT" in out

"""The trainer fan-out: the rank map of data-parallel replicas, and commands reaching every
trainer rank through its replica's root and broadcast, under real MPI."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
from mpi_jobs import MPIEXEC, job_env

from areal_hpc.config import load_config
from areal_hpc.slurm.scaling import strong_scaling_overrides
from areal_hpc.wire.layout import replica_ranks, trainer_ranks

WORKER = Path(__file__).with_name("fanout_worker.py")
# (tp, pp, dp): a small mixed layout, the paper's experiments and their 512-GPU points.
LAYOUTS = [(2, 2, 2), (1, 1, 32), (2, 1, 24), (4, 1, 16), (8, 2, 6), (1, 1, 128), (2, 1, 64), (4, 1, 32), (8, 2, 8)]


def config(tp: int, pp: int, dp: int):
    """The 32B model takes every layout here (40 heads, 8 query groups, 64 layers; 8 GPUs a node)."""
    return load_config("configs/experiments/code-32b.yaml", [
        f"trainer.tp={tp}", f"trainer.pp={pp}", f"trainer.dp={dp}", f"cluster.train_nodes={tp * pp * dp // 8}"])


@pytest.mark.parametrize(("tp", "pp", "dp"), LAYOUTS)
def test_every_trainer_rank_is_in_one_replica_of_tp_x_pp_ranks(tp, pp, dp):
    cfg = config(tp, pp, dp)
    replicas = replica_ranks(cfg)
    assert len(replicas) == dp and all(len(r) == tp * pp and r == sorted(r) for r in replicas)
    assert sorted(r for ranks in replicas for r in ranks) == trainer_ranks(cfg)
    assert replicas[0][0] == trainer_ranks(cfg)[0]  # trainer 0, which reports steps, is a root


@pytest.mark.parametrize(("tp", "pp", "dp"), LAYOUTS)
def test_the_rank_map_is_megatrons_rank_generator(tp, pp, dp):
    """Megatron's own group arithmetic for its default order (parallel_state.RankGenerator, what
    initialize_model_parallel uses): model-parallel groups are the replicas, and replica d holds
    position d of every data-parallel group."""
    from megatron.core.parallel_state import RankGenerator

    gen = RankGenerator(tp=tp, ep=1, dp=dp, pp=pp, cp=1, order="tp-cp-ep-dp-pp")
    replicas = [[r - 1 for r in ranks] for ranks in replica_ranks(config(tp, pp, dp))]  # trainer-local
    assert sorted(map(sorted, gen.get_ranks("tp-pp"))) == sorted(replicas)
    for group in gen.get_ranks("dp"):
        assert [next(d for d, members in enumerate(replicas) if r in members) for r in group] == list(range(dp))


def test_code_32b_replicas():
    cfg = load_config("configs/experiments/code-32b.yaml")
    replicas = replica_ranks(cfg)
    assert [r[0] for r in replicas] == [1, 9, 17, 25, 33, 41]  # tp 8 x pp 2 x dp 6
    assert replicas[1] == [*range(9, 17), *range(57, 65)]  # stage 0 then stage 1 of replica 1


def test_the_512_gpu_points_have_dp_replicas():
    for name in ("math-1.5b", "code-32b"):
        base = load_config(f"configs/experiments/{name}.yaml")
        cfg = load_config(f"configs/experiments/{name}.yaml", strong_scaling_overrides(base, 512, 32768, 1, "runs/scaling-point"))
        assert len(replica_ranks(cfg)) == cfg.trainer.dp == 128 // (cfg.trainer.tp * cfg.trainer.pp)


def test_every_trainer_rank_gets_its_replicas_share_and_every_command(tmp_path):
    out = tmp_path / "fanout.json"
    proc = subprocess.run([str(MPIEXEC), "-n", "5", sys.executable, str(WORKER), str(out)],
                          env=job_env(), capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    result = json.loads(out.read_text())
    replicas = [[1, 2], [3, 4]]  # tp 2 x dp 2
    assert sorted(set(result["sent_to"])) == [1, 3]  # rank 0 sends to the replica roots only
    assert len(result["sent_to"]) == 3 * 2  # one batch (a shard each) and two commands
    by_rank = {r["rank"]: r["got"] for r in result["reports"]}
    samples = []
    for d, members in enumerate(replicas):
        got = [by_rank[r] for r in members]
        assert all(g == got[0] for g in got)  # the root's broadcast: the same on every rank of a replica
        assert [m["type"] for m in got[0]] == ["TrainShard", "UpdateWeights", "Shutdown"]
        assert got[0][0]["replica"] == d
        samples += [tuple(s) for s in got[0][0]["samples"]]
    assert sorted(samples) == [(p, s) for p in range(4) for s in range(4)]

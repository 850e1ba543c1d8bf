"""TP=2, PP=2, DP=2, TP=2 with sequence parallelism and PP=2 with tied embeddings compute what
one rank computes, from the same starting weights; the runtime's rank map names Megatron's
data-parallel replicas."""

from __future__ import annotations

import pytest
import torch
from safetensors.torch import load_file

from areal_hpc.config import load_config
from areal_hpc.trainer.hf_checkpoint import HFCheckpoint
from areal_hpc.wire.layout import replica_ranks

pytestmark = pytest.mark.slow
LAYOUTS = ("tp2", "pp2", "dp2", "tp2sp", "pp2tied")
MODEL_PARALLEL = ("tp2", "pp2", "tp2sp", "pp2tied")


def reference(single_run: dict, layout: str) -> dict:
    return single_run["tied"] if layout.endswith("tied") else single_run


def merged(runs: list[dict], layout: str, key: str) -> dict[str, torch.Tensor]:
    """Stage leaders hold their stage's tensors; together they hold the whole model."""
    out: dict[str, torch.Tensor] = {}
    for run in runs:
        out.update(run[layout][key])
    return out


def max_diff(a: dict[str, torch.Tensor], b: dict[str, torch.Tensor]) -> float:
    assert sorted(a) == sorted(b)
    return max((a[k] - b[k]).abs().max().item() for k in a)


@pytest.mark.parametrize("layout", LAYOUTS)
def test_the_weight_plan_names_what_the_stream_yields(layouts_run, layout):
    assert all(run[layout]["plan_matches_stream"] for run in layouts_run)


@pytest.mark.parametrize("layout", LAYOUTS)
def test_loss_and_log_probs_equal_one_rank(layouts_run, single_run, layout):
    ref = reference(single_run, layout)
    for run in layouts_run:
        assert run[layout]["loss"] == pytest.approx(ref["loss"], rel=1e-6)
        got, want = run[layout]["logprobs"], ref["logprobs"]
        assert max(abs(a - b) for x, y in zip(got, want, strict=True) for a, b in zip(x, y, strict=True)) < 1e-5


@pytest.mark.parametrize("layout", MODEL_PARALLEL)
def test_gradients_equal_one_rank(layouts_run, single_run, layout):
    ref = reference(single_run, layout)["grads"]
    scale = max(g.abs().max().item() for g in ref.values())
    assert max_diff(merged(layouts_run, layout, "grads"), ref) < 1e-6 * max(scale, 1.0)


@pytest.mark.parametrize("layout", LAYOUTS)
def test_weights_after_an_optimizer_step_equal_one_rank(layouts_run, single_run, layout):
    # Adam's first step moves each weight by about lr = 1e-3; the layouts agree far below that.
    assert max_diff(merged(layouts_run, layout, "after_step"), reference(single_run, layout)["after_step"]) < 1e-5


@pytest.mark.parametrize("layout", MODEL_PARALLEL)
def test_export_from_shards_equals_the_loaded_checkpoint(layouts_run, trainer_out, tiny_model_dir,
                                                         tied_model_dir, layout):
    ckpt = HFCheckpoint(trainer_out / f"export-{layout}")
    exported = {name: ckpt.get(name) for name in ckpt.names()}
    source = tied_model_dir if layout.endswith("tied") else tiny_model_dir
    original = load_file(str(source / "model.safetensors"))
    assert sorted(exported) == sorted(original)
    for name, tensor in original.items():
        assert torch.equal(exported[name], tensor), name


def test_the_rank_map_is_megatrons_data_parallel_replicas(groups_run):
    """wire/layout.py replica_ranks against the groups Megatron built in a tp2-pp2-dp2 world."""
    cfg = load_config("configs/experiments/tiny-cpu.yaml", ["trainer.tp=2", "trainer.pp=2", "trainer.dp=2"])
    replicas = [[r - 1 for r in ranks] for ranks in replica_ranks(cfg)]  # trainer-local ranks
    for rank, got in enumerate(groups_run):
        assert rank in replicas[got["dp_rank"]]
        assert sorted(got["model_parallel"]) == replicas[got["dp_rank"]]

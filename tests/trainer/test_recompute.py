"""trainer.recompute reaches megatron-core as its TransformerConfig fields, recomputes what it
names (the MLP runs forward again in the backward pass), and changes no loss or gradient."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from conftest import run_worker

WORKER = Path(__file__).with_name("recompute_worker.py")


@pytest.fixture(scope="module")
def recompute_run(tmp_path_factory: pytest.TempPathFactory, tiny_model_dir: Path) -> dict:
    out = tmp_path_factory.mktemp("recompute")
    return run_worker("recompute", 1, out, tiny_model_dir, tiny_model_dir, worker=WORKER)[0]


def test_settings_map_to_megatron(recompute_run):
    assert recompute_run["none"]["megatron"][0] is None
    assert recompute_run["full"]["megatron"][:3] == ("full", "uniform", 1)
    assert recompute_run["full_uniform2"]["megatron"][:3] == ("full", "uniform", 2)
    assert recompute_run["full_block1"]["megatron"][:3] == ("full", "block", 1)
    assert recompute_run["selective"]["megatron"] == ("selective", None, None, ["mlp"])


def test_recomputed_layers_run_forward_again(recompute_run):
    k = recompute_run["none"]["micro_batches"]
    assert recompute_run["none"]["mlp_calls"] == [k] * 4
    assert recompute_run["full"]["mlp_calls"] == [2 * k] * 4
    assert recompute_run["full_uniform2"]["mlp_calls"] == [2 * k] * 4
    assert recompute_run["full_block1"]["mlp_calls"] == [2 * k, k, k, k]  # only the stage's first layer
    assert recompute_run["selective"]["mlp_calls"] == [2 * k] * 4


@pytest.mark.parametrize("name", ["full", "full_uniform2", "full_block1", "selective"])
def test_recomputation_changes_no_loss_or_gradient(recompute_run, name):
    ref, got = recompute_run["none"], recompute_run[name]
    assert got["loss"] == pytest.approx(ref["loss"], rel=1e-6)
    for n, g in ref["grads"].items():
        assert torch.allclose(got["grads"][n], g, atol=1e-7, rtol=1e-5), n

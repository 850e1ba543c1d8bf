"""The weight mapping of every family: every Hugging Face tensor is covered once, the tensors are
those transformers makes, and sharding round-trips."""

from __future__ import annotations

import pytest
import torch

from areal_hpc.config.hf import FAMILIES, hf_config_dict
from areal_hpc.config.schema import ModelConfig
from areal_hpc.trainer.convert import from_shards, hf_shapes, ignorable, stage_rules, to_shard


def model(family: str = "qwen2", **shape) -> ModelConfig:
    """A small model of `family`; Qwen3's head size (16) differs from hidden / heads (8)."""
    base = dict(vocab_size=64, hidden_size=32, intermediate_size=48, num_layers=4, num_attention_heads=4,
                num_query_groups=2, max_position_embeddings=128, rope_theta=1e4, rms_norm_eps=1e-6,
                tie_word_embeddings=False, head_dim=16 if family == "qwen3" else None)
    f = FAMILIES[family]
    return ModelConfig(family=family, qkv_bias=f.qkv_bias, qk_norm=f.qk_norm, **{**base, **shape})


MODEL = model()


def random_hf(m: ModelConfig) -> dict[str, torch.Tensor]:
    g = torch.Generator().manual_seed(0)
    return {n: torch.randn(s, generator=g) for n, s in hf_shapes(m).items()}


@pytest.mark.parametrize("family", FAMILIES)
@pytest.mark.parametrize("tied", [False, True])
@pytest.mark.parametrize("pp", [1, 2, 4])
def test_rules_cover_every_tensor_exactly_once(pp, tied, family):
    m = model(family, tie_word_embeddings=tied)
    exported = [n for s in range(pp) for r in stage_rules(m, s, pp) if r.exported for n in r.hf]
    assert sorted(exported) == sorted(hf_shapes(m))
    last = stage_rules(m, pp - 1, pp)
    assert any(r.megatron == "output_layer.weight" for r in last) == (not tied or pp > 1)


@pytest.mark.parametrize("family", FAMILIES)
@pytest.mark.parametrize("te_names", [False, True])
@pytest.mark.parametrize("tp", [1, 2])
def test_shards_round_trip_bit_identically(tp, te_names, family):
    m = model(family)
    hf = random_hf(m)
    for rule in stage_rules(m, 0, 1, te_names):
        tensors = [hf[n] for n in rule.hf]
        shards = [to_shard(rule, tensors, m, r, tp) for r in range(tp)]
        for got, want in zip(from_shards(rule, shards, m), tensors, strict=True):
            assert torch.equal(got, want), rule.megatron


@pytest.mark.parametrize("tied", [False, True])
@pytest.mark.parametrize("family", FAMILIES)
def test_expected_tensors_are_those_transformers_makes(family, tied):
    """hf_shapes against the family's transformers model built from hf_config_dict's config.json."""
    from transformers import AutoConfig, AutoModelForCausalLM

    m = model(family, tie_word_embeddings=tied, num_layers=2)
    hf = hf_config_dict(m)
    made = AutoModelForCausalLM.from_config(AutoConfig.for_model(hf.pop("model_type"), **hf))
    state = {n: tuple(t.shape) for n, t in made.state_dict().items() if not ignorable(m, n)}
    assert state == hf_shapes(m)


def test_family_rules_differ_only_in_bias_and_qk_norm():
    names = {f: {r.megatron for r in stage_rules(model(f), 0, 1)} for f in FAMILIES}
    assert names["qwen2"] - names["llama"] == {f"decoder.layers.{i}.self_attention.linear_qkv.bias" for i in range(4)}
    assert names["qwen3"] - names["llama"] == {f"decoder.layers.{i}.self_attention.{p}_layernorm.weight"
                                               for i in range(4) for p in "qk"}
    assert names["llama"] < names["qwen2"] and names["llama"] < names["qwen3"]


def test_qwen3_qkv_uses_its_own_head_size():
    m = model("qwen3")  # 4 heads of 16 = 64 query rows from hidden 32
    rule = next(r for r in stage_rules(m, 0, 1) if r.megatron.endswith("linear_qkv.weight"))
    hf = random_hf(m)
    assert hf[rule.hf[0]].shape == (64, 32)
    shard = to_shard(rule, [hf[n] for n in rule.hf], m, 1, 2)  # one group: 2 query heads, k, v
    assert shard.shape == ((2 + 2) * 16, 32)
    assert torch.equal(shard[:32], hf[rule.hf[0]][32:])


def test_qkv_is_fused_per_query_group_and_split_by_group():
    m = model(vocab_size=8, hidden_size=8, intermediate_size=8, num_layers=1,
              num_attention_heads=4, num_query_groups=2)  # head_dim 2, 2 query heads per group
    rule = next(r for r in stage_rules(m, 0, 1) if r.megatron.endswith("linear_qkv.bias"))
    q = torch.arange(8.0)  # heads 0..3, 2 values each
    k = torch.arange(100.0, 104.0)
    v = torch.arange(200.0, 204.0)
    full = to_shard(rule, [q, k, v], m, 0, 1)
    assert full.tolist() == [0, 1, 2, 3, 100, 101, 200, 201, 4, 5, 6, 7, 102, 103, 202, 203]
    assert to_shard(rule, [q, k, v], m, 1, 2).tolist() == [4, 5, 6, 7, 102, 103, 202, 203]


def test_gate_up_shards_hold_both_halves():
    m = model(vocab_size=8, hidden_size=2, intermediate_size=4, num_layers=1,
              num_attention_heads=1, num_query_groups=1)
    rule = next(r for r in stage_rules(m, 0, 1) if r.megatron.endswith("linear_fc1.weight"))
    gate, up = torch.arange(8.0).reshape(4, 2), torch.arange(10.0, 18.0).reshape(4, 2)
    shard = to_shard(rule, [gate, up], m, 1, 2)
    assert torch.equal(shard, torch.cat([gate[2:], up[2:]]))


def test_stage_layers_are_renumbered_locally():
    rules = stage_rules(MODEL, 1, 2)
    qkv = [r for r in rules if r.megatron.endswith("linear_qkv.weight")]
    assert [(r.megatron.split(".")[2], r.hf[0].split(".")[2]) for r in qkv] == [("0", "2"), ("1", "3")]

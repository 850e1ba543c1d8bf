"""The single weight mapping between Hugging Face tensors and Megatron TP/PP shards.

Loading a checkpoint, exporting one and streaming weights to the generators all go through the
rules here. Pure: names, shapes and tensor reshuffling, no I/O and no process groups. One rule
set serves every family (config/hf.py FAMILIES): the Qwen2, Qwen3 and Llama checkpoints name their
tensors alike and differ only in what the ModelConfig says: q/k/v biases (qkv_bias), per-head q/k
RMSNorm weights (qk_norm) and the head size (head_dim).

A Rule ties one Megatron parameter of a pipeline stage to the Hugging Face tensors it is made of,
and says how tensor parallelism cuts it:
- "replicated": every TP rank holds the whole tensor (norm weights, also the per-head q/k norms);
- "rows" / "cols": split along dim 0 (column-parallel linears, vocabulary) / dim 1 (row-parallel);
- "qkv": q, k and v fused per query group, [q heads of the group; k; v], groups split over TP;
- "gate_up": SwiGLU gate and up projections, each split over TP, [gate shard; up shard].
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from areal_hpc.config.schema import ModelConfig

LAYOUTS = ("replicated", "rows", "cols", "qkv", "gate_up")


@dataclass(frozen=True)
class Rule:
    # Parameter name inside this stage's (unwrapped) GPTModel; layer numbers are stage-local.
    megatron: str
    # The Hugging Face tensors it is built from, in order.
    hf: tuple[str, ...]
    layout: str
    # False for the last stage's copy of tied embeddings: Hugging Face stores it once.
    exported: bool = True


def stage_layers(m: ModelConfig, pp_rank: int, pp_size: int) -> range:
    """Global indices of the decoder layers held by pipeline stage `pp_rank`."""
    per_stage = m.num_layers // pp_size
    return range(pp_rank * per_stage, (pp_rank + 1) * per_stage)


def stage_rules(m: ModelConfig, pp_rank: int, pp_size: int, te_names: bool = False) -> list[Rule]:
    """Every parameter of one stage. `te_names`: Transformer Engine fuses the pre-attention and
    pre-MLP norms into the following linear, which renames their weights."""
    rules = []
    first, last = pp_rank == 0, pp_rank == pp_size - 1
    if first:
        rules.append(Rule("embedding.word_embeddings.weight", ("model.embed_tokens.weight",), "rows"))
    for local, i in enumerate(stage_layers(m, pp_rank, pp_size)):
        mg, hf = f"decoder.layers.{local}.", f"model.layers.{i}."
        attn = f"{hf}self_attn."
        norm1 = "self_attention.linear_qkv.layer_norm_weight" if te_names else "input_layernorm.weight"
        norm2 = "mlp.linear_fc1.layer_norm_weight" if te_names else "pre_mlp_layernorm.weight"
        rules += [
            Rule(mg + norm1, (f"{hf}input_layernorm.weight",), "replicated"),
            Rule(mg + "self_attention.linear_qkv.weight",
                 tuple(f"{attn}{p}_proj.weight" for p in "qkv"), "qkv"),
        ]
        if m.qkv_bias:
            rules.append(Rule(mg + "self_attention.linear_qkv.bias",
                              tuple(f"{attn}{p}_proj.bias" for p in "qkv"), "qkv"))
        if m.qk_norm:
            rules += [Rule(mg + f"self_attention.{p}_layernorm.weight", (f"{attn}{p}_norm.weight",), "replicated")
                      for p in "qk"]
        rules += [
            Rule(mg + "self_attention.linear_proj.weight", (f"{attn}o_proj.weight",), "cols"),
            Rule(mg + norm2, (f"{hf}post_attention_layernorm.weight",), "replicated"),
            Rule(mg + "mlp.linear_fc1.weight", (f"{hf}mlp.gate_proj.weight", f"{hf}mlp.up_proj.weight"), "gate_up"),
            Rule(mg + "mlp.linear_fc2.weight", (f"{hf}mlp.down_proj.weight",), "cols"),
        ]
    if last:
        rules.append(Rule("decoder.final_layernorm.weight", ("model.norm.weight",), "replicated"))
        if not m.tie_word_embeddings:
            rules.append(Rule("output_layer.weight", ("lm_head.weight",), "rows"))
        elif not first:  # the last stage keeps its own copy of the tied embedding
            rules.append(Rule("output_layer.weight", ("model.embed_tokens.weight",), "rows", exported=False))
    return rules


def hf_shapes(m: ModelConfig) -> dict[str, tuple[int, ...]]:
    """Every tensor a Hugging Face checkpoint of this shape and family must hold, with its shape."""
    h, hn, f = m.hidden_size, m.head_size, m.intermediate_size
    q, kv = m.num_attention_heads * hn, m.num_query_groups * hn
    shapes: dict[str, tuple[int, ...]] = {"model.embed_tokens.weight": (m.vocab_size, h), "model.norm.weight": (h,)}
    if not m.tie_word_embeddings:
        shapes["lm_head.weight"] = (m.vocab_size, h)
    for i in range(m.num_layers):
        p = f"model.layers.{i}."
        shapes.update({
            p + "input_layernorm.weight": (h,),
            p + "post_attention_layernorm.weight": (h,),
            p + "self_attn.q_proj.weight": (q, h),
            p + "self_attn.k_proj.weight": (kv, h),
            p + "self_attn.v_proj.weight": (kv, h),
            p + "self_attn.o_proj.weight": (h, q),
            p + "mlp.gate_proj.weight": (f, h),
            p + "mlp.up_proj.weight": (f, h),
            p + "mlp.down_proj.weight": (h, f),
        })
        if m.qkv_bias:
            shapes.update({p + "self_attn.q_proj.bias": (q,), p + "self_attn.k_proj.bias": (kv,),
                           p + "self_attn.v_proj.bias": (kv,)})
        if m.qk_norm:
            shapes.update({p + "self_attn.q_norm.weight": (hn,), p + "self_attn.k_norm.weight": (hn,)})
    return shapes


def ignorable(m: ModelConfig, name: str) -> bool:
    """Tensors a valid checkpoint may carry that the model does not use."""
    return name.endswith("rotary_emb.inv_freq") or (m.tie_word_embeddings and name == "lm_head.weight")


def to_shard(rule: Rule, tensors: list[torch.Tensor], m: ModelConfig, tp_rank: int, tp_size: int) -> torch.Tensor:
    """This TP rank's part of the Megatron parameter, from its full Hugging Face tensors."""
    if rule.layout == "replicated":
        return tensors[0]
    if rule.layout in ("rows", "cols"):
        return tensors[0].chunk(tp_size, dim=0 if rule.layout == "rows" else 1)[tp_rank]
    if rule.layout == "gate_up":
        gate, up = (t.chunk(tp_size, dim=0)[tp_rank] for t in tensors)
        return torch.cat([gate, up])
    if rule.layout == "qkv":
        groups = m.num_query_groups
        q, k, v = (t.reshape(groups, -1, *t.shape[1:]) for t in tensors)
        fused = torch.cat([q, k, v], dim=1)  # [groups, (heads_per_group + 2) * hn, ...]
        per_rank = groups // tp_size
        part = fused[tp_rank * per_rank:(tp_rank + 1) * per_rank]
        return part.reshape(-1, *tensors[0].shape[1:])
    raise ValueError(f"unknown layout {rule.layout!r}")


def from_shards(rule: Rule, shards: list[torch.Tensor], m: ModelConfig) -> list[torch.Tensor]:
    """The full Hugging Face tensors of a Megatron parameter, from its shards in TP-rank order."""
    if rule.layout == "replicated":
        return [shards[0]]
    if rule.layout in ("rows", "cols"):
        return [torch.cat(shards, dim=0 if rule.layout == "rows" else 1)]
    if rule.layout == "gate_up":
        halves = [s.chunk(2, dim=0) for s in shards]
        return [torch.cat([g for g, _ in halves]), torch.cat([u for _, u in halves])]
    if rule.layout == "qkv":
        hn = m.head_size
        q_rows = m.num_attention_heads // m.num_query_groups * hn
        per_rank = m.num_query_groups // len(shards)
        fused = torch.cat([s.reshape(per_rank, q_rows + 2 * hn, *s.shape[1:]) for s in shards])
        q, k, v = fused.split([q_rows, hn, hn], dim=1)
        rest = shards[0].shape[1:]
        return [t.reshape(-1, *rest) for t in (q, k, v)]
    raise ValueError(f"unknown layout {rule.layout!r}")

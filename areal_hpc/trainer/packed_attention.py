"""Core attention for packed, padding-free (THD) micro-batches without Transformer Engine.

Megatron's local DotProductAttention rejects packed sequences
(transformer/dot_product_attention.py:153) and only TEDotProductAttention, which needs CUDA,
accepts them. This module takes its place in the layer spec on CPU: it runs causal scaled
dot-product attention separately on each sequence delimited by cu_seqlens, so tokens never attend
across sequence boundaries, and it also serves ordinary [s, b, h] batches.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from megatron.core.packed_seq_params import PackedSeqParams
from megatron.core.transformer.module import MegatronModule
from megatron.core.transformer.transformer_config import TransformerConfig


class PackedCoreAttention(MegatronModule):
    """Causal attention per sequence; signature of megatron's core-attention modules."""

    def __init__(self, config: TransformerConfig, layer_number: int, attn_mask_type, attention_type: str,
                 attention_dropout: float | None = None, softmax_scale: float | None = None,
                 cp_comm_type: str | None = None, pg_collection=None):
        super().__init__(config=config)
        if config.context_parallel_size != 1:
            raise ValueError("PackedCoreAttention does not support context parallelism")
        self.softmax_scale = softmax_scale
        self.dropout = config.attention_dropout if attention_dropout is None else attention_dropout

    def _attend(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
        """q [b, s, np, hn], k/v [b, s, ng, hn] -> [b, s, np, hn], causal, grouped-query."""
        out = F.scaled_dot_product_attention(
            q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2), is_causal=True,
            dropout_p=self.dropout if self.training else 0.0, scale=self.softmax_scale,
            enable_gqa=q.size(2) != k.size(2),
        )
        return out.transpose(1, 2)

    def forward(self, query: torch.Tensor, key: torch.Tensor, value: torch.Tensor, attention_mask,
                attn_mask_type=None, attention_bias=None,
                packed_seq_params: PackedSeqParams | None = None) -> torch.Tensor:
        if attention_bias is not None:
            raise ValueError("PackedCoreAttention does not support an attention bias")
        if packed_seq_params is not None and packed_seq_params.qkv_format == "thd":
            # [t, np, hn]: one token axis holding every sequence back to back. torch.split, not a
            # slice per sequence: a slice's backward writes a zero tensor of the whole micro-batch,
            # so n sequences would cost n full-size writes per layer; split's backward is one cat.
            bounds = packed_seq_params.cu_seqlens_q.tolist()
            lengths = [e - s for s, e in zip(bounds[:-1], bounds[1:], strict=True)]
            q, k, v = (x.split(lengths) for x in (query, key, value))
            parts = [self._attend(qs.unsqueeze(0), ks.unsqueeze(0), vs.unsqueeze(0))[0]
                     for qs, ks, vs in zip(q, k, v, strict=True) if qs.size(0)]
            return torch.cat(parts).flatten(1)
        # [s, b, np, hn] -> [s, b, np * hn]
        out = self._attend(query.transpose(0, 1), key.transpose(0, 1), value.transpose(0, 1))
        return out.transpose(0, 1).flatten(2)

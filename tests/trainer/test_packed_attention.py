"""PackedCoreAttention: causal attention within each packed sequence, never across."""

import pytest
import torch
import torch.nn.functional as F

pytest.importorskip("megatron.core")
from megatron.core.packed_seq_params import PackedSeqParams  # noqa: E402
from megatron.core.transformer.transformer_config import TransformerConfig  # noqa: E402

from areal_hpc.trainer.packed_attention import PackedCoreAttention  # noqa: E402


def layer(**kw) -> PackedCoreAttention:
    cfg = TransformerConfig(num_layers=1, hidden_size=64, num_attention_heads=4, attention_dropout=0.0, **kw)
    return PackedCoreAttention(cfg, 1, None, "self")


def reference(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
    """One sequence [s, np, hn] / [s, ng, hn], causal, key/value heads repeated for the groups."""
    rep = q.size(1) // k.size(1)
    out = F.scaled_dot_product_attention(q.transpose(0, 1), k.repeat_interleave(rep, 1).transpose(0, 1),
                                         v.repeat_interleave(rep, 1).transpose(0, 1), is_causal=True)
    return out.transpose(0, 1).flatten(1)


@pytest.mark.parametrize("lengths", [[5, 1, 9, 3], [7], [4, 0, 6]])
def test_packed_equals_each_sequence_alone_with_its_gradients(lengths) -> None:
    torch.manual_seed(0)
    attn = layer(num_query_groups=2)
    t = sum(lengths)
    q, k, v = (torch.randn(t, h, 16, requires_grad=True) for h in (4, 2, 2))
    cu = torch.tensor([0, *torch.tensor(lengths).cumsum(0).tolist()], dtype=torch.int32)
    params = PackedSeqParams(qkv_format="thd", cu_seqlens_q=cu, cu_seqlens_kv=cu,
                             max_seqlen_q=max(lengths), max_seqlen_kv=max(lengths))
    out = attn(q, k, v, None, packed_seq_params=params)
    grad = torch.randn_like(out)
    out.backward(grad)

    bounds = cu.tolist()
    q2, k2, v2 = (x.detach().clone().requires_grad_() for x in (q, k, v))
    want = torch.cat([reference(q2[s:e], k2[s:e], v2[s:e]) for s, e in zip(bounds[:-1], bounds[1:], strict=True) if e > s])
    want.backward(grad)
    torch.testing.assert_close(out, want)
    for got, ref in ((q.grad, q2.grad), (k.grad, k2.grad), (v.grad, v2.grad)):
        torch.testing.assert_close(got, ref)


def test_no_token_attends_across_a_boundary() -> None:
    """Changing the second sequence leaves the first one's outputs unchanged, and the reverse."""
    torch.manual_seed(1)
    attn = layer()
    cu = torch.tensor([0, 6, 10], dtype=torch.int32)
    params = PackedSeqParams(qkv_format="thd", cu_seqlens_q=cu, cu_seqlens_kv=cu, max_seqlen_q=6, max_seqlen_kv=6)
    q, k, v = (torch.randn(10, 4, 16) for _ in range(3))
    base = attn(q, k, v, None, packed_seq_params=params)
    k2, v2 = k.clone(), v.clone()
    k2[6:], v2[6:] = torch.randn(4, 4, 16), torch.randn(4, 4, 16)
    moved = attn(q, k2, v2, None, packed_seq_params=params)
    torch.testing.assert_close(moved[:6], base[:6])
    assert not torch.allclose(moved[6:], base[6:])
    k3 = k.clone()
    k3[:6] = torch.randn(6, 4, 16)
    torch.testing.assert_close(attn(q, k3, v, None, packed_seq_params=params)[6:], base[6:])

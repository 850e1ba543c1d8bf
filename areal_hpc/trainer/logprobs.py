"""log pi(label) at every token from vocab-parallel logits, a chunk of tokens at a time.

At the paper's 32,768-token micro-batches the fp32 copy of full-vocabulary logits is the largest
tensor of a step (1.5B at tp 1: 32,768 x 151,936 x 4 bytes = 20 GB, and as much again for its
softmax and gradient). Here only one chunk of tokens is ever upcast to fp32: the forward pass
keeps the model's own (bf16) logits and one log-sum-exp per token; the backward pass recomputes
each chunk's softmax from them and writes the gradient into one buffer of the logits' dtype.

Exact under tensor parallelism as megatron's vocab_parallel_cross_entropy: each rank holds the
logits of its contiguous vocabulary slice; the maximum, the sum of exponentials and the label's
logit are all-reduced over the tensor-parallel group per chunk, and each rank's gradient is that
of its own slice (the output layer's backward reduces the input gradient).
"""

from __future__ import annotations

import torch
import torch.distributed as dist


class _ChunkedLogprobs(torch.autograd.Function):
    """lp[t] = z[t, label] / T - logsumexp(z[t] / T), over chunks of `chunk` tokens."""

    @staticmethod
    def forward(ctx, logits: torch.Tensor, labels: torch.Tensor, inv_temperature: float, chunk: int,
                group, vocab_start: int) -> torch.Tensor:
        tokens, local_vocab = logits.shape
        out = torch.empty(tokens, dtype=torch.float32, device=logits.device)
        lse = torch.empty_like(out)
        reduce = group is not None
        for s in range(0, tokens, chunk):
            e = min(s + chunk, tokens)
            z = _fp32_copy(logits[s:e])
            if inv_temperature != 1.0:
                z.mul_(inv_temperature)
            top = z.max(dim=-1).values
            if reduce:
                dist.all_reduce(top, op=dist.ReduceOp.MAX, group=group)
            z.sub_(top.unsqueeze(-1))
            local, mine = _local_labels(labels[s:e], vocab_start, local_vocab)
            picked = z.gather(1, local.unsqueeze(1)).squeeze(1).masked_fill_(~mine, 0.0)
            sums = z.exp_().sum(dim=-1)
            if reduce:
                dist.all_reduce(picked, group=group)
                dist.all_reduce(sums, group=group)
            log_sums = sums.log_()
            out[s:e] = picked - log_sums
            lse[s:e] = top + log_sums
        ctx.save_for_backward(logits, labels, lse)
        ctx.inv_temperature, ctx.chunk, ctx.vocab_start = inv_temperature, chunk, vocab_start
        return out

    @staticmethod
    def backward(ctx, grad_out: torch.Tensor):
        logits, labels, lse = ctx.saved_tensors
        inv_t, chunk = ctx.inv_temperature, ctx.chunk
        tokens, local_vocab = logits.shape
        grad = torch.empty_like(logits)
        for s in range(0, tokens, chunk):
            e = min(s + chunk, tokens)
            p = _fp32_copy(logits[s:e])
            if inv_t != 1.0:
                p.mul_(inv_t)
            p.sub_(lse[s:e].unsqueeze(-1)).exp_().neg_()  # -softmax
            local, mine = _local_labels(labels[s:e], ctx.vocab_start, local_vocab)
            rows = torch.arange(e - s, device=p.device)[mine]
            p[rows, local[mine]] += 1.0  # d lp / d z = (onehot(label) - softmax) / T
            p.mul_((grad_out[s:e].float() * inv_t).unsqueeze(-1))
            grad[s:e] = p
        return grad, None, None, None, None, None


def _fp32_copy(chunk: torch.Tensor) -> torch.Tensor:
    """A new fp32 tensor (.float() of fp32 logits would be the logits, which are changed in place)."""
    return chunk.to(torch.float32, copy=True)


def _local_labels(labels: torch.Tensor, vocab_start: int, local_vocab: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Labels as indices into this rank's vocabulary slice (0 where not in it), and which are."""
    local = labels.long() - vocab_start
    mine = (local >= 0) & (local < local_vocab)
    return local.masked_fill(~mine, 0), mine


def token_logprobs(logits: torch.Tensor, labels: torch.Tensor, temperature: float, chunk_tokens: int,
                   tp_group=None, tp_rank: int = 0) -> torch.Tensor:
    """fp32 log-probs [T] of `labels` [T] under softmax(logits / temperature) from this rank's
    vocabulary slice `logits` [T, V / tp] (slice tp_rank of the tensor-parallel group `tp_group`;
    None when the slice is the whole vocabulary). Temperature 0 (greedy) and 1 use the logits as
    they are. Differentiable in `logits`."""
    inv_temperature = 1.0 if temperature in (0.0, 1.0) else 1.0 / temperature
    vocab_start = tp_rank * logits.size(-1)
    group = tp_group if tp_group is not None and dist.get_world_size(tp_group) > 1 else None
    return _ChunkedLogprobs.apply(logits, labels, inv_temperature, chunk_tokens, group, vocab_start)

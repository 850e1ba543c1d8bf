"""Packed, padding-free micro-batches: sequences back to back on one token axis (THD layout).

A sequence is a prompt followed by an output; the model reads prompt + output[:-1] and position j
predicts token j + 1, so the last len(output) positions of a sequence are the ones scored. Values
given per output token (behaviour log-probs, advantages...) are laid on those positions.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch


@dataclass
class TokenSequence:
    prompt: list[int]
    output: list[int]
    # Per-output-token values by name, each of len(output).
    values: dict[str, list[float]] = field(default_factory=dict)

    @property
    def length(self) -> int:
        """Tokens the model reads."""
        return len(self.prompt) + len(self.output) - 1


@dataclass
class PackedMicroBatch:
    tokens: torch.Tensor  # [1, T] input ids
    labels: torch.Tensor  # [T] next token (0 where nothing is scored)
    mask: torch.Tensor  # [T] 1.0 on positions that predict an output token
    cu_seqlens: torch.Tensor  # [n + 1] int32 sequence boundaries (a padding tail is its own span)
    max_seqlen: int
    values: dict[str, torch.Tensor]  # [T] per-token values, 0 off the mask
    members: list[int]  # caller's indices of the sequences, in packing order
    output_lengths: list[int]

    @property
    def num_tokens(self) -> int:
        return self.tokens.size(1)

    def packed_seq_params(self):
        from megatron.core.packed_seq_params import PackedSeqParams

        return PackedSeqParams(
            qkv_format="thd", cu_seqlens_q=self.cu_seqlens, cu_seqlens_kv=self.cu_seqlens,
            max_seqlen_q=self.max_seqlen, max_seqlen_kv=self.max_seqlen,
        )

    def per_sequence(self, per_token: torch.Tensor) -> list[torch.Tensor]:
        """Split a [T] tensor into the scored positions of each member sequence."""
        return list(per_token[self.mask.to(per_token.device).bool()].split(self.output_lengths))


def pack(seqs: list[TokenSequence], members: list[int], device: str = "cpu", multiple_of: int = 1) -> PackedMicroBatch:
    """Pack `seqs[i] for i in members`; pad the token axis to a multiple (sequence parallelism)."""
    tokens: list[int] = []
    labels: list[int] = []
    mask: list[float] = []
    names = sorted(seqs[members[0]].values) if members else []
    values: dict[str, list[float]] = {n: [] for n in names}
    bounds = [0]
    for i in members:
        s = seqs[i]
        full = s.prompt + s.output
        n_prompt = len(s.prompt) - 1
        tokens += full[:-1]
        labels += full[1:]
        mask += [0.0] * n_prompt + [1.0] * len(s.output)
        for n in names:
            values[n] += [0.0] * n_prompt + list(s.values[n])
        bounds.append(len(tokens))
    pad = -len(tokens) % multiple_of
    if pad:
        tokens += [0] * pad
        labels += [0] * pad
        mask += [0.0] * pad
        for n in names:
            values[n] += [0.0] * pad
        bounds.append(len(tokens))
    lengths = [b - a for a, b in zip(bounds[:-1], bounds[1:], strict=True)]
    return PackedMicroBatch(
        tokens=torch.tensor([tokens], dtype=torch.long, device=device),
        labels=torch.tensor(labels, dtype=torch.long, device=device),
        mask=torch.tensor(mask, dtype=torch.float32, device=device),
        cu_seqlens=torch.tensor(bounds, dtype=torch.int32, device=device),
        max_seqlen=max(lengths, default=0),
        values={n: torch.tensor(v, dtype=torch.float32, device=device) for n, v in values.items()},
        members=list(members),
        output_lengths=[len(seqs[i].output) for i in members],
    )

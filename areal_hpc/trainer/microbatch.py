"""Packed, padding-free micro-batches: sequences back to back on one token axis (THD layout).

A sequence is a prompt followed by an output; the model reads prompt + output[:-1] and position j
predicts token j + 1, so the last len(output) positions of a sequence are the ones scored. Values
given per output token (behaviour log-probs, advantages...) are laid on those positions. Token ids
are numpy arrays (a trajectory's own, not copied); a micro-batch is filled by slice copies into
preallocated arrays, one per sequence and field rather than one per token.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

import numpy as np
import torch


@dataclass
class TokenSequence:
    prompt: np.ndarray  # int32; a list is converted
    output: np.ndarray
    # Per-output-token values by name, each of len(output) (arrays or lists).
    values: dict[str, Sequence[float] | np.ndarray] = field(default_factory=dict)

    def __post_init__(self) -> None:
        self.prompt = np.asarray(self.prompt, dtype=np.int32)
        self.output = np.asarray(self.output, dtype=np.int32)

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
    chosen = [seqs[i] for i in members]
    names = sorted(chosen[0].values) if chosen else []
    bounds = np.cumsum([0, *(s.length for s in chosen)])
    pad = -int(bounds[-1]) % multiple_of
    total = int(bounds[-1]) + pad
    tokens = np.zeros(total, dtype=np.int64)
    labels = np.zeros(total, dtype=np.int64)
    mask = np.zeros(total, dtype=np.float32)
    values = {n: np.zeros(total, dtype=np.float32) for n in names}
    for s, start in zip(chosen, bounds[:-1].tolist(), strict=True):
        scored = start + len(s.prompt) - 1  # the position that predicts the first output token
        end = start + s.length
        tokens[start:scored + 1] = s.prompt
        tokens[scored + 1:end] = s.output[:-1]
        labels[start:scored] = s.prompt[1:]
        labels[scored:end] = s.output
        mask[scored:end] = 1.0
        for n in names:
            values[n][scored:end] = s.values[n]
    if pad:
        bounds = np.append(bounds, total)
    return PackedMicroBatch(
        tokens=torch.from_numpy(tokens).to(device).unsqueeze(0),
        labels=torch.from_numpy(labels).to(device),
        mask=torch.from_numpy(mask).to(device),
        cu_seqlens=torch.from_numpy(bounds.astype(np.int32)).to(device),
        max_seqlen=int(np.diff(bounds).max(initial=0)),
        values={n: torch.from_numpy(v).to(device) for n, v in values.items()},
        members=list(members),
        output_lengths=[len(s.output) for s in chosen],
    )

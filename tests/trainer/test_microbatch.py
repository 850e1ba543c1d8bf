"""A packed micro-batch lays sequences back to back, from trajectory arrays or lists alike."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from areal_hpc.trainer.microbatch import TokenSequence, pack


def test_pack_lays_prompts_outputs_and_values_on_one_token_axis():
    seqs = [TokenSequence(np.array([1, 2], np.int32), np.array([3, 4, 5], np.int32),
                          {"behav": np.array([0.1, 0.2, 0.3], np.float32)}),
            TokenSequence([6], [7], {"behav": [0.4]})]
    mb = pack(seqs, [1, 0], multiple_of=4)
    assert mb.tokens.dtype == torch.long and mb.tokens.tolist() == [[6, 1, 2, 3, 4, 0, 0, 0]]
    assert mb.labels.tolist() == [7, 2, 3, 4, 5, 0, 0, 0]
    assert mb.mask.tolist() == [1, 0, 1, 1, 1, 0, 0, 0]
    assert mb.cu_seqlens.dtype == torch.int32 and mb.cu_seqlens.tolist() == [0, 1, 5, 8]
    assert mb.max_seqlen == 4 and mb.output_lengths == [1, 3]
    assert mb.values["behav"].tolist() == pytest.approx([0.4, 0, 0.1, 0.2, 0.3, 0, 0, 0])
    assert [s.tolist() for s in mb.per_sequence(torch.arange(8.0))] == [[0.0], [2.0, 3.0, 4.0]]

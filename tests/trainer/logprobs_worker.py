"""One rank of the tensor-parallel log-prob test (run under torch.distributed.run, gloo, CPU).

    python -m torch.distributed.run --nproc-per-node 2 tests/trainer/logprobs_worker.py logprobs OUT MODEL MODEL

Every rank draws the same full logits, keeps its vocabulary slice as a TP=2 output layer would,
and saves the chunked log-probs with their gradient in its slice (several chunk sizes and
temperatures), and megatron's vocab_parallel_cross_entropy on the same slice, to
OUT/logprobs-rank<r>.pt; tests/trainer/test_logprobs.py compares them.
"""

from __future__ import annotations

import os
import sys
import traceback
from pathlib import Path

import torch

from areal_hpc.config import load_config
from areal_hpc.trainer.logprobs import token_logprobs
from areal_hpc.trainer.parallel import init_trainer_world

# tokens, vocabulary (the tiny model's), chunk sizes, temperatures
TOKENS, VOCAB = 45, 512
CHUNKS = (1, 7, 16, TOKENS)
TEMPERATURES = (1.0, 0.6)


def inputs() -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Full logits [T, V], labels [T] and an upstream gradient [T], the same on every rank."""
    g = torch.Generator().manual_seed(3)
    return (torch.randn(TOKENS, VOCAB, generator=g) * 4, torch.randint(0, VOCAB, (TOKENS,), generator=g),
            torch.randn(TOKENS, generator=g))


def main() -> None:
    out, rank = Path(sys.argv[2]), int(os.environ["RANK"])
    try:
        from megatron.core import parallel_state
        from megatron.core.tensor_parallel import vocab_parallel_cross_entropy

        cfg = load_config("configs/experiments/tiny-cpu.yaml", ["trainer.tp=2"])
        init_trainer_world(cfg, rank, 2, "env://")
        group, tp_rank = parallel_state.get_tensor_model_parallel_group(), parallel_state.get_tensor_model_parallel_rank()
        full, labels, upstream = inputs()
        part = VOCAB // 2
        result: dict = {"tp_rank": tp_rank}
        for temperature in TEMPERATURES:
            for chunk in CHUNKS:
                mine = full[:, tp_rank * part:(tp_rank + 1) * part].clone().requires_grad_()
                lp = token_logprobs(mine, labels, temperature, chunk, group, tp_rank)
                (lp * upstream).sum().backward()
                result[temperature, chunk] = (lp.detach(), mine.grad)
            mine = full[:, tp_rank * part:(tp_rank + 1) * part] / temperature
            result[temperature, "megatron"] = -vocab_parallel_cross_entropy(mine.unsqueeze(1), labels.unsqueeze(1))[:, 0]
    except Exception:
        result = {"error": traceback.format_exc()}
    torch.save(result, out / f"logprobs-rank{rank}.pt")
    torch.distributed.destroy_process_group()


if __name__ == "__main__":
    main()

"""One trainer rank (CPU, gloo) for tests/trainer/test_recompute.py:

    python -m torch.distributed.run --nproc-per-node 1 tests/trainer/recompute_worker.py recompute OUT MODEL MODEL

For each trainer.recompute setting, the SFT loss and gradients of the same batch from the same
weights, megatron's TransformerConfig recompute fields, and how often each layer's MLP ran
forward (twice per micro-batch where it is recomputed), with log-probs in chunks of 16 tokens.
Saved to OUT/recompute-rank0.pt.
"""

from __future__ import annotations

import os
import sys
import traceback
from pathlib import Path

import torch
from trainer_worker import config, sft_batch

from areal_hpc.trainer.engine import TrainEngine
from areal_hpc.trainer.parallel import init_trainer_world

SETTINGS = {
    "none": (),
    "full": ("trainer.recompute=full",),
    "full_uniform2": ("trainer.recompute=full", "trainer.recompute_num_layers=2"),
    "full_block1": ("trainer.recompute=full", "trainer.recompute_method=block", "trainer.recompute_num_layers=1"),
    "selective": ("trainer.recompute=selective", "trainer.recompute_modules=[mlp]"),
}
CHUNK = "trainer.logprob_chunk_tokens=16"


def measure(extra: tuple[str, ...], model_dir: str) -> dict:
    engine = TrainEngine(config(1, 1, 1, CHUNK, *extra))
    engine.load_hf(model_dir)
    calls = [0] * len(engine.model.decoder.layers)
    for i, layer in enumerate(engine.model.decoder.layers):
        layer.mlp.register_forward_hook(lambda *_, i=i: calls.__setitem__(i, calls[i] + 1))
    seqs = engine._sft_sequences(sft_batch())
    loss = engine._sft_backward(seqs)
    c = engine.model.config
    return {"loss": loss, "grads": {n: p.main_grad.clone() for n, p in engine.model.named_parameters()},
            "mlp_calls": calls, "micro_batches": len(engine._micro_batches(seqs, list(range(len(seqs))))),
            "megatron": (c.recompute_granularity, c.recompute_method, c.recompute_num_layers,
                         list(c.recompute_modules or []))}


def main() -> None:
    out, model_dir = Path(sys.argv[2]), sys.argv[3]
    try:
        init_trainer_world(config(), 0, 1, "env://")
        result = {name: measure(extra, model_dir) for name, extra in SETTINGS.items()}
    except Exception:
        result = {"error": traceback.format_exc()}
    torch.save(result, out / f"recompute-rank{os.environ.get('RANK', '0')}.pt")
    torch.distributed.destroy_process_group()


if __name__ == "__main__":
    main()

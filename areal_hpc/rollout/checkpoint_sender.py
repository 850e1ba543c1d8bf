"""A WeightSender in its own process that pushes safetensors checkpoints: a trainer stand-in.

Where a trainer stage leader would send its exported weights, this process reads a Hugging Face
checkpoint directory and sends its tensors through the same protocol. Tests and benchmarks use it
to drive real generators without a trainer.
"""

from __future__ import annotations

import multiprocessing as mp
import time
from collections.abc import Callable
from pathlib import Path

import torch

from areal_hpc.rollout.weight_transfer import WeightSender, bucketed

# Optional edit of the tensors before sending (a module-level function, so it can cross processes).
Transform = Callable[[list[tuple[str, torch.Tensor]]], list[tuple[str, torch.Tensor]]]


def read_checkpoint(model_dir: str | Path) -> list[tuple[str, torch.Tensor]]:
    """Every tensor of a safetensors checkpoint, in the files' order."""
    from safetensors.torch import load_file

    files = sorted(Path(model_dir).glob("*.safetensors"))
    if not files:
        raise FileNotFoundError(f"{model_dir}: no *.safetensors files")
    return [pair for f in files for pair in load_file(str(f)).items()]


def _main(host: str, port: int, world_size: int, backend: str, bucket_bytes: int, gpu: int, commands,
          results) -> None:
    # One thread: this process only moves and checksums tensors, and more threads than free cores
    # make those small reductions many times slower on a shared machine.
    torch.set_num_threads(1)
    if backend == "nccl":
        torch.cuda.set_device(gpu)
    sender = WeightSender(host, port, world_size, backend)
    while (command := commands.get()) is not None:
        version, model_dir, transform = command
        try:
            tensors = read_checkpoint(model_dir)
            if transform is not None:
                tensors = transform(tensors)
            if backend == "nccl":
                tensors = [(n, t.cuda()) for n, t in tensors]
            start = time.perf_counter()
            checksums = sender.send(version, bucketed(tensors, bucket_bytes))
            results.put({"checksums": checksums, "send_s": time.perf_counter() - start,
                         "transfer_s": sender.transfer_s, "bytes": sum(t.nbytes for _, t in tensors)})
        except Exception as e:  # reported to the caller, who decides
            results.put(f"{type(e).__name__}: {e}")
    sender.close()


class CheckpointSender:
    """Rank 0 of one weight group, in a spawned process, sending checkpoints on command."""

    def __init__(self, host: str, port: int, world_size: int, backend: str = "gloo",
                 bucket_bytes: int = 256 * 2**20, gpu: int = 0) -> None:
        """`gpu`: the sender's CUDA device with the nccl backend (NCCL ranks need distinct GPUs)."""
        ctx = mp.get_context("spawn")
        self._commands, self._results = ctx.Queue(), ctx.Queue()
        self._process = ctx.Process(
            target=_main,
            args=(host, port, world_size, backend, bucket_bytes, gpu, self._commands, self._results),
            daemon=True,
        )
        self._process.start()

    def send(self, version: int, model_dir: str | Path, transform: Transform | None = None) -> None:
        """Start sending `model_dir` as `version`; the generators must `update_weights(version)`."""
        self._commands.put((version, str(model_dir), transform))

    def result(self, timeout: float = 300) -> dict:
        """The last send's checksums, seconds and bytes; raises RuntimeError with the sender's error."""
        out = self._results.get(timeout=timeout)
        if isinstance(out, str):
            raise RuntimeError(f"weight sender: {out}")
        return out

    def close(self) -> None:
        self._commands.put(None)
        self._process.join(timeout=30)
        if self._process.is_alive():
            self._process.kill()
            self._process.join()

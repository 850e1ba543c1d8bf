"""Chunked log-probs (trainer/logprobs.py) equal the full fp32 log-softmax and its gradients, in
every chunk size, at a temperature, in bf16, and split over two tensor-parallel ranks."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from conftest import run_worker
from logprobs_worker import CHUNKS, TEMPERATURES, VOCAB, inputs

from areal_hpc.trainer.logprobs import token_logprobs

WORKER = Path(__file__).with_name("logprobs_worker.py")


def reference(logits: torch.Tensor, labels: torch.Tensor, temperature: float, upstream: torch.Tensor):
    """The unchunked computation: fp32 log-softmax of all logits, autograd's gradient."""
    x = logits.detach().clone().requires_grad_()
    t = 1.0 if temperature in (0.0, 1.0) else temperature
    lp = (x.float() / t).log_softmax(-1).gather(1, labels.unsqueeze(1))[:, 0]
    (lp * upstream).sum().backward()
    return lp.detach(), x.grad


def chunked(logits: torch.Tensor, labels: torch.Tensor, temperature: float, upstream: torch.Tensor, chunk: int):
    x = logits.detach().clone().requires_grad_()
    lp = token_logprobs(x, labels, temperature, chunk)
    (lp * upstream).sum().backward()
    return lp.detach(), x.grad


@pytest.mark.parametrize("temperature", (1.0, 0.6, 0.0))
def test_every_chunk_size_gives_the_full_log_softmax_and_its_gradient(temperature):
    logits, labels, upstream = inputs()
    want_lp, want_grad = reference(logits, labels, temperature, upstream)
    whole_lp, whole_grad = chunked(logits, labels, temperature, upstream, len(labels))
    assert whole_lp.dtype == torch.float32 and whole_grad.dtype == logits.dtype
    assert (whole_lp - want_lp).abs().max() < 1e-5
    assert (whole_grad - want_grad).abs().max() < 1e-5
    for chunk in (1, 4, 13, 1000):
        lp, grad = chunked(logits, labels, temperature, upstream, chunk)
        assert (lp - whole_lp).abs().max() < 1e-6, chunk
        assert (grad - whole_grad).abs().max() < 1e-7, chunk


def test_bf16_logits_get_fp32_log_probs_and_a_bf16_gradient():
    logits, labels, upstream = inputs()
    half = logits.bfloat16()
    want_lp, want_grad = reference(half, labels, 0.6, upstream)  # upcast whole, as before chunking
    lp, grad = chunked(half, labels, 0.6, upstream, 8)
    assert lp.dtype == torch.float32 and grad.dtype == torch.bfloat16
    assert (lp - want_lp).abs().max() < 1e-5
    assert (grad.float() - want_grad.float()).abs().max() <= 2 ** -8 * want_grad.float().abs().max()


def test_without_gradients_nothing_is_kept_for_a_backward_pass():
    logits, labels, _ = inputs()
    with torch.no_grad():
        lp = token_logprobs(logits, labels, 1.0, 5)
    assert not lp.requires_grad
    assert (lp - logits.log_softmax(-1).gather(1, labels.unsqueeze(1))[:, 0]).abs().max() < 1e-5


@pytest.fixture(scope="module")
def tp2_run(tmp_path_factory: pytest.TempPathFactory, tiny_model_dir: Path) -> list[dict]:
    out = tmp_path_factory.mktemp("logprobs")
    return run_worker("logprobs", 2, out, tiny_model_dir, tiny_model_dir, worker=WORKER)


@pytest.mark.parametrize("temperature", TEMPERATURES)
def test_tensor_parallel_chunks_equal_one_rank_and_megatron(tp2_run, temperature):
    """Each TP rank's log-probs are those of the whole vocabulary, its gradient is its slice of
    the whole gradient, and megatron's vocab_parallel_cross_entropy agrees."""
    logits, labels, upstream = inputs()
    want_lp, want_grad = reference(logits, labels, temperature, upstream)
    part = VOCAB // 2
    for run in tp2_run:
        r = run["tp_rank"]
        assert (run[temperature, "megatron"] - want_lp).abs().max() < 1e-5
        for chunk in CHUNKS:
            lp, grad = run[temperature, chunk]
            assert (lp - want_lp).abs().max() < 1e-5, chunk
            assert (grad - want_grad[:, r * part:(r + 1) * part]).abs().max() < 1e-5, chunk

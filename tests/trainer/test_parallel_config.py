"""Trainer layouts that cannot run are refused before any process group exists, by name."""

from __future__ import annotations

import pytest
import torch

from areal_hpc.config.load import load_config
from areal_hpc.errors import ConfigError, UserError
from areal_hpc.trainer.errors import ParallelConfigError
from areal_hpc.trainer.parallel import init_trainer_world, parallel_problems


def cfg_with(**trainer):
    cfg = load_config("configs/experiments/tiny-cpu.yaml")
    for key, value in trainer.items():
        setattr(cfg.trainer, key, value)
    return cfg


@pytest.mark.parametrize("trainer, world, message", [
    ({"tp": 2}, 4, "trainer.tp * trainer.pp * trainer.dp = 2*1*1 = 2 but the trainer world has 4 ranks"),
    ({"tp": 8}, 8, "trainer.tp = 8: must divide model.num_attention_heads = 4 and model.num_query_groups = 2"),
    ({"pp": 3}, 3, "trainer.pp = 3: must divide model.num_layers = 4"),
    ({"sequence_parallel": True}, 1, "trainer.sequence_parallel = true: needs trainer.tp > 1"),
])
def test_bad_layouts_are_named(trainer, world, message):
    cfg = cfg_with(**trainer)
    assert message in parallel_problems(cfg, world)
    with pytest.raises(ParallelConfigError, match=message.replace("*", r"\*")) as info:
        init_trainer_world(cfg, 0, world, "tcp://127.0.0.1:1")
    assert isinstance(info.value, UserError)
    assert not torch.distributed.is_initialized()


def test_vocabulary_must_split_over_tensor_parallel_ranks():
    cfg = cfg_with(tp=2)
    cfg.model.vocab_size = 511
    assert "trainer.tp = 2: must divide model.vocab_size = 511" in parallel_problems(cfg, 2)


def test_a_valid_layout_has_no_problems():
    assert parallel_problems(cfg_with(tp=2, pp=2, dp=1), 4) == []


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the error on a machine without a GPU")
def test_cuda_requested_without_a_gpu():
    cfg = cfg_with()
    cfg.device = "cuda"
    with pytest.raises(ConfigError, match="no CUDA device"):
        init_trainer_world(cfg, 0, 1, "tcp://127.0.0.1:1")

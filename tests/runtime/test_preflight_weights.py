"""A paper config as shipped names a model directory with only config.json: the launch stops at
preflight, before any data or model is read, saying to set model.path to the checkpoint."""

from __future__ import annotations

import pytest

from areal_hpc.config.load import load_config
from areal_hpc.errors import UserError
from areal_hpc.runtime.preflight import preflight


def test_a_launch_without_weights_stops_at_preflight(tmp_path) -> None:
    config = "configs/experiments/math-1.5b.yaml"
    world = load_config(config).world_size
    with pytest.raises(UserError) as info:
        preflight(config, [f"logging.dir={tmp_path}"], world)
    assert str(info.value) == (
        "model.path = 'configs/models/DeepSeek-R1-Distill-Qwen-1.5B': no weights there (no *.safetensors files),"
        " only the model's shape; set model.path to the checkpoint directory"
        " (--set model.path=/path/to/DeepSeek-R1-Distill-Qwen-1.5B)")
    assert not list(tmp_path.iterdir())  # refused before the run lock or anything else is written

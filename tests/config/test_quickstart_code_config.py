"""The code quickstart's config and the rule tying the synthetic programs task to the code reward."""

from __future__ import annotations

import re

import pytest

from areal_hpc.config.load import load_config
from areal_hpc.errors import ConfigError

CONFIG = "configs/experiments/quickstart-code.yaml"
TINY = "configs/experiments/tiny-cpu.yaml"


def test_the_code_quickstart_runs_the_programs_task_under_the_code_reward() -> None:
    cfg = load_config(CONFIG)  # validated, files included
    assert (cfg.data.synthetic_task, cfg.reward.kind, cfg.reward.code.backend) == ("programs", "code", "auto")
    assert cfg.world_size == 3


def test_the_programs_task_needs_the_code_reward(tmp_path) -> None:
    with pytest.raises(ConfigError, match=re.escape("data.synthetic_task = 'programs': its answers are tests that"
                                                    " reward.kind code runs, not math")):
        load_config(TINY, ["data.synthetic_task=programs"])
    rows = tmp_path / "rows.jsonl"
    rows.write_text('{"prompt": "1+1=", "answer": "2"}\n')
    # Both splits from files: the synthetic task is not used, so any reward goes.
    load_config(TINY, ["data.synthetic_task=programs", f"data.train_path={rows}", f"data.eval_path={rows}"])
    with pytest.raises(ConfigError, match=re.escape("data.synthetic_task = 'code': must be one of arithmetic, programs")):
        load_config(TINY, ["data.synthetic_task=code", "reward.kind=code"])

"""The data section of a config: layouts give the keys, and the data rules of config/validate.py."""

from __future__ import annotations

import re

import pytest

from areal_hpc.config.load import load_config
from areal_hpc.config.schema import DataConfig
from areal_hpc.errors import ConfigError

TINY = "configs/experiments/tiny-cpu.yaml"


def test_layouts_give_the_keys_and_set_keys_win():
    assert DataConfig().row_keys() == ("prompt", "answer")
    assert DataConfig(layout="verl").row_keys() == ("prompt", "reward_model.ground_truth")
    assert DataConfig(layout="areal-math").row_keys() == ("prompt", "solutions")
    assert DataConfig(layout="areal-code").row_keys() == ("prompt", "input_output")
    assert DataConfig(layout="verl", answer_key="extra_info.answer").row_keys() == ("prompt", "extra_info.answer")


@pytest.mark.parametrize("override, fragment", [
    ("data.layout=hf", "data.layout = 'hf': must be one of flat, verl, areal-math, areal-code"),
    ("data.overlong=drop", "data.overlong = 'drop': must be one of filter, error"),
    ("data.answer_key=reward_model..ground_truth", "data.answer_key = 'reward_model..ground_truth': must be a key"),
    ("data.chat_template=/no/such.jinja", "data.chat_template = '/no/such.jinja': not auto, none or an existing"),
    ("data.train_path=/no/such/dir", "data.train_path = '/no/such/dir': file not found"),
    ("data.synthetic_ops=+/", "data.synthetic_ops = '+/': must be a non-empty subset of"),
    ("data.synthetic_ops=++", "data.synthetic_ops = '++': must be a non-empty subset of"),
    ("data.synthetic_max_ops=9", "data.synthetic_max_ops = 9: must be between 1 and 8"),
])
def test_bad_data_settings_are_named(override, fragment):
    with pytest.raises(ConfigError, match=re.escape(fragment)):
        load_config(TINY, [override])


def test_a_dataset_directory_and_a_template_file_are_accepted(tmp_path):
    (tmp_path / "t.jinja").write_text("{{ messages }}")
    cfg = load_config(TINY, [f"data.train_path={tmp_path}", f"data.chat_template={tmp_path / 't.jinja'}",
                             "data.chat_template_kwargs={enable_thinking: false}"])
    assert cfg.data.chat_template_kwargs == {"enable_thinking": False}

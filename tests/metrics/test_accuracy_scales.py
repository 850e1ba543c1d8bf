"""The accuracy metrics count responses judged right by their reward check, on any reward scale:
a verl-style custom function's 0/1 (or bool, or dict with "acc") and the built-in math check's
reward.correct/reward.wrong (+5/-5) alike, in one batch too."""

from __future__ import annotations

from pathlib import Path

import pytest

from areal_hpc.config.schema import RewardConfig
from areal_hpc.metrics.batch import accuracy, batch_stats
from areal_hpc.reward.custom import check_custom, load_function
from areal_hpc.reward.math_check import check_math
from areal_hpc.reward.task import CustomTask, MathTask, Verdict
from areal_hpc.wire.messages import Trajectory

VERL_STYLE = '''
def compute_score(data_source, solution_str, ground_truth, extra_info=None):
    return 1.0 if solution_str.strip().endswith(ground_truth) else 0.0


def is_right(data_source, solution_str, ground_truth, extra_info=None):
    return solution_str.strip().endswith(ground_truth)


def dapo_style(data_source, solution_str, ground_truth, extra_info=None):
    right = solution_str.strip().endswith(ground_truth)
    return {"score": 1.0 if right else -1.0, "acc": right, "pred": solution_str[-3:]}
'''


def scored(verdict: Verdict, source: str) -> Trajectory:
    """A trajectory with its verdict, as a generator rank sends it."""
    t = Trajectory(0, 0, [1], [2, 3], [0.0, 0.0], [0, 0], "stop", data_source=source)
    t.reward, t.reward_reason, t.reward_infra, t.reward_metrics = verdict.reward, verdict.reason, verdict.infra, verdict.metrics
    t.correct = verdict.correct
    return t


@pytest.mark.parametrize("name, rewards", [
    ("compute_score", [1.0, 0.0, 1.0, 0.0]), ("is_right", [1.0, 0.0, 1.0, 0.0]), ("dapo_style", [1.0, -1.0, 1.0, -1.0]),
])
def test_a_custom_function_on_its_own_scale(tmp_path: Path, name: str, rewards: list[float]) -> None:
    (tmp_path / "my_reward.py").write_text(VERL_STYLE)
    config = RewardConfig(kind="custom", function=f"{tmp_path / 'my_reward.py'}:{name}")  # correct stays +5
    fn = load_function(config.function)
    responses = ["so 12", "so 13", "12", "no idea"]
    batch = [scored(check_custom(CustomTask(r, "mine", "12"), fn, config), "mine") for r in responses]
    assert [t.reward for t in batch] == rewards  # reported as the function scored them
    stats = batch_stats(batch, version=0)
    assert stats["accuracy"] == stats["source/mine/accuracy"] == 0.5
    assert stats["reward_mean"] == sum(rewards) / 4


def test_the_math_check_and_a_custom_function_in_one_batch(tmp_path: Path) -> None:
    (tmp_path / "my_reward.py").write_text(VERL_STYLE)
    config = RewardConfig(kind="math", by_source={"mine": "custom"}, function=f"{tmp_path / 'my_reward.py'}:compute_score")
    fn = load_function(config.function)
    batch = [scored(check_math(MathTask("\\boxed{4}", "4"), config), "gsm8k"),
             scored(check_math(MathTask("\\boxed{5}", "4"), config), "gsm8k"),
             scored(check_math(MathTask("\\boxed{6}", "6"), config), "gsm8k"),
             scored(check_custom(CustomTask("12", "mine", "12"), fn, config), "mine"),
             scored(check_custom(CustomTask("7", "mine", "12"), fn, config), "mine")]
    assert [t.reward for t in batch] == [5.0, -5.0, 5.0, 1.0, 0.0]
    stats = batch_stats(batch, version=0)
    assert stats["source/gsm8k/accuracy"] == pytest.approx(2 / 3) and stats["source/mine/accuracy"] == 0.5
    assert stats["accuracy"] == accuracy(batch) == 0.6

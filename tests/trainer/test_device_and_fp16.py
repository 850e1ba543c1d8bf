"""fp16 steps the loss scaler skips are run again (no data dropped, no version for a skipped
update), and `device: cpu` stays on the CPU on a machine with a GPU. Real megatron-core, one rank
per scenario in its own process (tests/trainer/device_worker.py)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from areal_hpc.trainer.loss_scale import MIN_LOSS_SCALE, futile_skip

WORKER = Path(__file__).with_name("device_worker.py")


def run_scenario(scenario: str, out: Path, model_dir: Path) -> dict:
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONWARNINGS": "ignore"}
    proc = subprocess.run([sys.executable, str(WORKER), scenario, str(out), str(model_dir)], env=env,
                          capture_output=True, text=True, timeout=600)
    path = out / f"{scenario}.pt"
    if not path.is_file():
        pytest.fail(f"{scenario} exited {proc.returncode}:\n{proc.stderr[-4000:]}")
    result = torch.load(path, weights_only=False)
    if "error" in result:
        pytest.fail(f"{scenario} failed:\n{result['error']}")
    return result


@pytest.fixture(scope="module")
def out(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("device")


def test_skipped_fp16_steps_are_retried_to_the_same_update(out: Path, tiny_model_dir: Path) -> None:
    runs = run_scenario("fp16", out, tiny_model_dir)
    skipping, clean = runs["from_2^32"], runs["from_2^10"]
    m = skipping["metrics"]
    # 2^32 overflows fp16: Megatron skipped steps and lowered the scale until the update fitted.
    assert m["skipped_steps"] > 0 and m["loss_scale"] < 2.0**32
    assert clean["metrics"]["skipped_steps"] == 0 and clean["metrics"]["loss_scale"] == 2.0**10
    # One version for the batch; one applied optimizer step per minibatch (ppo.minibatches = 2).
    assert skipping["version"] == clean["version"] == 1 == m["version"]
    assert skipping["optimizer_steps"] == clean["optimizer_steps"] == 2
    # The retried minibatches trained the whole batch once, to the same update as without skips.
    # The two runs end at different power-of-two scales, which round the fp16 gradients near zero
    # differently; Adam's first step turns those into small differences in a few weights (measured:
    # under 1e-5, 355 of 0.9M). A dropped or doubled minibatch moves nearly every weight by about
    # lr = 1e-3 instead, so the bounds are a tenth of lr and 1% of the weights.
    assert m["grad_norm"] == pytest.approx(clean["metrics"]["grad_norm"], rel=1e-6)
    assert m["loss"] == pytest.approx(clean["metrics"]["loss"], rel=1e-6)
    assert m["output_tokens"] == clean["metrics"]["output_tokens"]
    assert skipping["weights"].keys() == clean["weights"].keys()
    differing = total = 0
    for name, w in clean["weights"].items():
        torch.testing.assert_close(skipping["weights"][name], w, rtol=0, atol=1e-4, msg=name)
        differing += int((skipping["weights"][name] != w).sum())
        total += w.numel()
    assert differing < 0.01 * total, f"{differing} of {total} weights differ"


def test_a_nan_no_loss_scale_can_rescue_fails_the_step(out: Path, tiny_model_dir: Path) -> None:
    result = run_scenario("fp16_nan", out, tiny_model_dir)
    assert result["raised"] is not None, "a NaN batch trained"
    assert "training step for version 1: fp16 gradients are not finite even at the minimum loss scale 1" in \
        result["raised"]
    # From 8 = 2^3: 3 halvings after 2 skips at the start scale, then one at the floor.
    assert "(5 skipped optimizer steps)" in result["raised"]
    assert result["version"] == 0 and result["optimizer_steps"] == 0


def test_retry_rule() -> None:
    assert futile_skip(2.0, 3) is None
    assert futile_skip(2.0**32, 1) is None
    why = futile_skip(MIN_LOSS_SCALE, 7)
    assert why is not None and "(7 skipped optimizer steps)" in why and "trainer.params_dtype = bf16" in why


def test_cpu_device_on_a_gpu_machine_trains_on_the_cpu(out: Path, tiny_model_dir: Path) -> None:
    result = run_scenario("cpu_on_gpu_machine", out, tiny_model_dir)
    assert result["active"] and result["devices"] == ["cpu"]
    assert result["metrics"]["version"] == 1.0 and result["metrics"]["skipped_steps"] == 0

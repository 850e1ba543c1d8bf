"""Messages carry token ids, log-probs and versions as compact arrays, on the wire and in checkpoints."""

from __future__ import annotations

import json

import numpy as np
import pytest

from areal_hpc.config.load import load_config
from areal_hpc.trainer.batch_plan import shards
from areal_hpc.wire.messages import GenerateRequest, SamplingParams, Trajectory
from areal_hpc.wire.transport import decode, encode


def trajectory(pid: int, n: int, seed: int = 0) -> Trajectory:
    rng = np.random.default_rng(seed)
    return Trajectory(pid, 1, rng.integers(0, 151_936, 40).tolist(), rng.integers(0, 151_936, n).tolist(),
                      (-rng.exponential(1.0, n)).tolist(), [3] * (n // 2) + [4] * (n - n // 2), "stop", reward=5.0)


def test_fields_are_int32_and_float32_arrays_whatever_the_caller_passes():
    t = trajectory(0, 10)
    assert [getattr(t, f).dtype for f in ("prompt_ids", "output_ids", "logprobs", "versions")] == [
        np.int32, np.int32, np.float32, np.int32]
    assert t.num_tokens == 50 and t.oldest_version == 3
    assert GenerateRequest(0, [5, 6], 1, SamplingParams(8)).prompt_ids.dtype == np.int32


def test_ragged_fields_are_refused_naming_the_sample():
    with pytest.raises(ValueError, match="prompt 7 sample 2: 3 output tokens but 3 logprobs and 2 versions"):
        Trajectory(7, 2, [1], [1, 2, 3], [0.0] * 3, [0, 0], "stop")


def test_a_batch_round_trips_through_the_channel_encoding_as_packed_arrays():
    # What the controller sends a data-parallel replica (here the only one: the whole batch).
    (batch,) = shards(load_config("configs/experiments/tiny-cpu.yaml"), 3, [trajectory(i, 10_000, i) for i in range(10)])
    data, buffers = encode(batch)
    # Each field of all ten in one array: 400 kB output ids, log-probs and versions go out of band
    # (one trajectory's 40 kB would not).
    assert [memoryview(b).nbytes for b in buffers] == [400_000] * 3
    assert len(data) < 10 * 40 * 4 + 3_000
    back = decode(data, buffers)
    assert back == batch
    assert back.trajectories[1].logprobs.dtype == np.float32
    assert back.trajectories[0].output_ids.base is back.trajectories[9].output_ids.base  # views, not copies


def test_checkpoint_state_is_json_and_exact():
    t = trajectory(5, 1_000)
    back = Trajectory.from_state(json.loads(json.dumps(t.to_state())))
    assert back == t and back.versions.dtype == np.int32
    back.logprobs[0] = 0.0  # writable, like a received trajectory

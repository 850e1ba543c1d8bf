"""The trajectory buffer: groups kept together, oldest first, state for checkpoints."""

from __future__ import annotations

import json

import pytest

from areal_hpc.controller.buffer import TrajectoryBuffer, trainable
from areal_hpc.wire.messages import Trajectory


def traj(pid: int, i: int) -> Trajectory:
    return Trajectory(pid, i, [1, 2], [3, 4, 5], [-0.1, -0.2, -0.3], [0, 0, 1], "stop", reward=5.0)


def test_groups_complete_only_with_every_sample_and_leave_oldest_first():
    buf = TrajectoryBuffer()
    for pid in (7, 3, 9):
        buf.open(pid, version=0, size=2)
    assert buf.add(traj(9, 1)) is None
    assert buf.add(traj(9, 0)).prompt_id == 9
    assert buf.add(traj(3, 0)) is None
    assert buf.ready == 1 and buf.running == 2
    group = buf.add(traj(3, 1))
    assert [t.sample_index for t in group.trajectories] == [0, 1]
    assert buf.ready_ids() == [3, 9]  # submission order, not completion order
    assert buf.running_ids() == [7]
    assert buf.running_versions == {0: 1} and buf.ready_versions == {0: 2}
    assert [g.prompt_id for g in buf.pop_batch(2)] == [3, 9]
    assert buf.ready_versions == {}  # a version with no prompt left is gone
    with pytest.raises(ValueError):
        buf.pop_batch(1)


def test_unknown_or_duplicate_samples_are_errors():
    buf = TrajectoryBuffer()
    buf.open(1, 0, 2)
    buf.add(traj(1, 0))
    with pytest.raises(KeyError):
        buf.add(traj(1, 0))
    with pytest.raises(KeyError):
        buf.add(traj(2, 0))
    with pytest.raises(KeyError):
        buf.open(1, 0, 2)


def test_state_keeps_complete_groups_and_drops_running_ones():
    buf = TrajectoryBuffer()
    buf.open(1, 0, 1)
    buf.open(2, 1, 1)
    buf.open(3, 1, 1)
    buf.add(traj(3, 0))
    buf.add(traj(1, 0))
    state = json.loads(json.dumps(buf.state_dict()))  # what a checkpoint stores
    restored = TrajectoryBuffer.from_state(state)
    assert restored.ready_ids() == [1, 3] and restored.running == 0
    assert restored.pop_batch(2)[1].trajectories == [traj(3, 0)]
    restored.open(2, 2, 1)  # the in-flight prompt, issued again after resume, is newest
    restored.add(traj(2, 0))
    assert restored.ready_ids() == [2]


def test_samples_the_reward_service_failed_on_are_left_out_of_training():
    buf = TrajectoryBuffer()
    for pid in (1, 2):
        buf.open(pid, version=0, size=2)
    failed = traj(1, 1)
    failed.reward_infra, failed.reward, failed.reward_reason = True, -5.0, "scoring timed out after 7 s"
    for t in (traj(1, 0), failed, traj(2, 0), traj(2, 1)):
        buf.add(t)
    kept, left_out = trainable(buf.pop_batch(2))
    assert [(t.prompt_id, t.sample_index) for t in kept] == [(1, 0), (2, 0), (2, 1)]
    assert left_out == [failed]
    back = Trajectory.from_state(json.loads(json.dumps(failed.to_state())))
    assert back.reward_infra and back == failed  # through a checkpoint, as through the wire

"""Processes sharing too few cores: the wall clock slows while more are busy than cores."""

from __future__ import annotations

import pytest

from areal_hpc.sim.host import SharedHost


def test_no_slowdown_while_the_cores_suffice():
    host = SharedHost(2, [(0.0, 10.0, 1), (2.0, 5.0, 1)])
    assert [host.wall(t) for t in (0.0, 3.0, 10.0, 12.0)] == [0.0, 3.0, 10.0, 12.0]


def test_three_busy_on_two_cores_take_half_as_long_again():
    # Work 0-4: one process; 4-10: three (two engines and a trainer) on two cores; then one again.
    host = SharedHost(2, [(0.0, 12.0, 1), (4.0, 10.0, 1), (4.0, 10.0, 1)])
    assert host.wall(4.0) == 4.0
    assert host.wall(10.0) == pytest.approx(4.0 + 6.0 * 1.5)
    assert host.wall(12.0) == pytest.approx(13.0 + 2.0)
    assert host.walls([(4.0, 10.0)]) == [(4.0, pytest.approx(13.0))]


def test_fractional_processes_and_spans_from_time_zero():
    # A pipeline-parallel trainer's 2 ranks busy 1.5 at once on average, with an engine: 2.5 on 2 cores.
    host = SharedHost(2, [(0.0, 2.0, 1.5), (0.0, 2.0, 1)])
    assert host.wall(2.0) == pytest.approx(2.5)


def test_a_host_has_a_core():
    with pytest.raises(ValueError, match="at least one core"):
        SharedHost(0, [])

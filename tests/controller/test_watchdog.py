"""The watchdog's deadlines: explicit, or following the run's own pace."""

from __future__ import annotations

from areal_hpc.config.schema import WatchdogConfig
from areal_hpc.controller.watchdog import GENERATION, TRAIN_STEP, WEIGHT_UPDATE, UpdateMembers, Watchdog


def test_an_automatic_deadline_follows_the_longest_completed_run():
    w = Watchdog(WatchdogConfig(factor=4.0, min_s=10.0, first_s=100.0))
    assert w.deadline(TRAIN_STEP) == 100.0  # nothing measured yet
    w.start(TRAIN_STEP, "the trainer", "for version 0", now=0.0)
    assert w.overdue(99.0) == []
    w.finish(TRAIN_STEP, "the trainer", now=30.0)
    assert w.deadline(TRAIN_STEP) == 120.0
    w.start(TRAIN_STEP, "the trainer", "for version 1", now=30.0)
    w.finish(TRAIN_STEP, "the trainer", now=31.0)
    assert w.deadline(TRAIN_STEP) == 120.0  # the longest, not the latest
    w.start(TRAIN_STEP, "the trainer", "for version 2", now=40.0)
    (late,) = w.overdue(161.0)
    assert late.describe() == ("the trainer: training step for version 2 has taken 121 s, past its deadline of"
                               " 120 s (watchdog.train_step_s)")
    assert Watchdog(WatchdogConfig(factor=4.0, min_s=10.0)).deadline(WEIGHT_UPDATE) == 3600.0


def test_explicit_seconds_win_and_a_floor_holds():
    w = Watchdog(WatchdogConfig(weight_update_s=7.0, factor=2.0, min_s=50.0))
    assert w.deadline(WEIGHT_UPDATE) == 7.0
    w.start(GENERATION, "rank 4 (generator 0)", "its prompts in flight", 0.0)
    w.progress(GENERATION, "rank 4 (generator 0)", "its prompts in flight", 1.0)
    assert w.deadline(GENERATION) == 50.0  # 2 x 1 s, at least min_s


def test_progress_restarts_the_clock_and_cancel_forgets_it():
    w = Watchdog(WatchdogConfig(generation_s=10.0))
    w.start_if_idle(GENERATION, "g", "work", 0.0)
    w.start_if_idle(GENERATION, "g", "work", 8.0)  # already watched: the clock keeps its start
    assert [o.who for o in w.overdue(11.0)] == ["g"]
    w.progress(GENERATION, "g", "work", 11.0)
    assert w.overdue(20.0) == []
    w.cancel(GENERATION, "g")
    assert w.overdue(1000.0) == []


def test_an_update_queued_behind_another_is_the_one_a_member_is_in_after_the_first_loads():
    """Seen in CI: step 2 ended before generator 1 loaded version 1. Its load of version 1 must
    not end the watch of version 2, in which it then hung."""
    m = UpdateMembers()
    m.sent(3, 1)
    m.begun(3, 1)
    m.sent(3, 2)  # queued behind version 1
    assert m.version(3) == 2 and not m.took_up(3)
    m.begun(3, 1)  # a late report of the older update does not count for the latest
    assert not m.took_up(3) and m.not_begun([2, 3]) == [3]
    assert m.loaded(3, 1) == 2  # still in version 2's update
    assert m.version(3) == 2
    m.begun(3, 2)
    assert m.took_up(3) and m.not_begun([3]) == []
    assert m.loaded(3, 2) is None and m.version(3) is None


def test_a_dropped_member_is_in_no_update():
    m = UpdateMembers()
    m.sent(2, 4)
    m.sent(3, 4)
    m.begun(2, 4)
    m.drop(3)
    assert m.not_begun([2, 3]) == [] and m.version(3) is None and m.took_up(2)

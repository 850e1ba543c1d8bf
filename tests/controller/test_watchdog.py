"""The watchdog's deadlines: explicit, or following the run's own pace."""

from __future__ import annotations

from areal_hpc.config.schema import WatchdogConfig
from areal_hpc.controller.watchdog import (
    CHECKPOINT,
    GENERATION,
    TRAIN_STEP,
    WEIGHT_UPDATE,
    Overdue,
    UpdateMembers,
    Verdict,
    Watchdog,
    judge,
)


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


def _late(op: str, who: str, what: str = "version 2", elapsed: float = 31.0) -> Overdue:
    return Overdue(op, who, what, elapsed, 30.0)


GENERATORS = {"rank 2 (generator 0)": 2, "rank 3 (generator 1)": 3}


def test_a_trainer_past_its_deadline_while_it_sends_to_a_member_that_never_took_the_update_up():
    """The trainer waits on the member, not the other way round: the member is dropped though its
    own clock is far from its deadline, and the trainer's clock starts again."""
    late = [_late(TRAIN_STEP, "the trainer", "for version 2")]
    verdict = judge(late, GENERATORS, waiting=[2], culprits={3: 1}, sending=True, alive=[2, 3], min_generators=1)
    assert verdict.fatal is None and list(verdict.drop) == [3]
    assert verdict.drop[3].startswith("hung: rank 3 (generator 1): never took up the weight update to version 1,"
                                      " which the trainer waits to send (the trainer: training step for version 2")
    assert verdict.restart == tuple(late)
    loading = judge(late, GENERATORS, waiting=[2], culprits={3: 2}, sending=True, alive=[2, 3], min_generators=1,
                    loading=[3])  # still loading version 1: its own clock says whether it hangs
    assert loading == Verdict(restart=tuple(late))


def test_a_trainer_past_its_deadline_ends_the_job_unless_a_culprit_holds_its_send():
    late = [_late(CHECKPOINT, "the trainer", "step-4")]
    for culprits, sending in (({3: 1}, False), ({}, True), ({}, False)):
        verdict = judge(late, GENERATORS, waiting=[2], culprits=culprits, sending=sending, alive=[2, 3],
                        min_generators=1)
        assert verdict.fatal == "hung: the trainer: saving checkpoint step-4 has taken 31 s, past its deadline of" \
                                " 30 s (watchdog.checkpoint_s)" and not verdict.drop
    both = judge(late, GENERATORS, waiting=[], culprits={2: 1, 3: 1}, sending=True, alive=[2, 3], min_generators=1)
    assert both.fatal is not None and "rank 2 (generator 0): never took up" in both.fatal
    assert "rank 3 (generator 1): never took up" in both.fatal


def test_members_that_took_an_update_up_wait_on_the_one_that_did_not():
    waits = [_late(WEIGHT_UPDATE, "rank 2 (generator 0)")]
    verdict = judge(waits, GENERATORS, waiting=[2], culprits={3: 2}, sending=True, alive=[2, 3], min_generators=1)
    assert verdict == Verdict(restart=tuple(waits))
    hung = [*waits, _late(WEIGHT_UPDATE, "rank 3 (generator 1)")]
    verdict = judge(hung, GENERATORS, waiting=[2], culprits={3: 2}, sending=True, alive=[2, 3], min_generators=1)
    assert list(verdict.drop) == [3] and verdict.restart == tuple(waits) and verdict.fatal is None
    assert verdict.drop[3] == "hung: " + hung[1].describe()
    transport = judge(waits, GENERATORS, waiting=[2], culprits={}, sending=True, alive=[2, 3], min_generators=1)
    assert transport.fatal is not None


def test_a_hung_generator_is_dropped_only_while_enough_are_left():
    late = [_late(GENERATION, "rank 3 (generator 1)", "its prompts in flight")]
    kept = judge(late, GENERATORS, waiting=[], culprits={}, sending=False, alive=[2, 3], min_generators=1)
    assert list(kept.drop) == [3] and kept.fatal is None
    ended = judge(late, GENERATORS, waiting=[], culprits={}, sending=False, alive=[2, 3], min_generators=2)
    assert ended.fatal == "hung: " + late[0].describe() and not ended.drop


def test_a_member_sent_an_update_it_has_not_read_is_not_paused():
    members = UpdateMembers()
    members.sent(2, 1)
    assert not members.paused(2)
    members.begun(2, 1)
    members.sent(2, 2)  # queued behind the one it is loading
    assert members.paused(2) and not members.took_up(2)
    assert members.loaded(2, 1) == 2 and not members.paused(2)
    members.begun(2, 2)
    assert members.paused(2) and members.took_up(2)
    members.drop(2)
    assert not members.paused(2)

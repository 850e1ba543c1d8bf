"""The controller's scheduler, driven event by event: no MPI, no files, no clock."""

from __future__ import annotations

import pytest

from areal_hpc.controller.scheduler import (
    Checkpoint,
    EvalFinished,
    GeneratorLoad,
    Policy,
    Scheduler,
    StepFinished,
    Submit,
    SyncFinished,
    SyncWeights,
    Train,
    WeightMismatch,
    WeightsVerified,
    eval_id,
)
from areal_hpc.wire.messages import Trajectory

GENERATORS = [4, 5]


def make(eta: int = 1, b: int = 2, k: int = 2, mc: int = 8, total: int = 3, **policy) -> Scheduler:
    return Scheduler(Policy(eta, b, k, mc, "strict", total, **policy), GENERATORS, train_size=10, held_out_size=3)


def sample(pid: int, i: int) -> Trajectory:
    return Trajectory(pid, i, [1], [2], [0.0], [0], "stop")


def finish(s: Scheduler, submits: list[Submit]) -> list:
    out = []
    for c in submits:
        for i in range(s.policy.group_size):
            out += s.on_trajectory(sample(c.prompt_id, i))
    return out


def sync(s: Scheduler, version: int) -> list:
    out = s.on_weights_sent(0, version, {"w": "x"})
    for g in GENERATORS:
        out += s.on_weights_loaded(g, version, {"w": "x"})
    return out


def kinds(commands: list) -> list[type]:
    return [type(c) for c in commands]


def test_least_loaded_prefers_fewest_then_lowest_rank():
    load = GeneratorLoad([5, 3, 4])
    assert load.least_loaded() == 3
    load.add(3, 2)
    load.add(4, 1)
    assert load.least_loaded() == 5
    load.add(5, 1)
    assert load.least_loaded() == 4
    load.add(3, -2)
    assert load.least_loaded() == 3
    assert eval_id(0) == -1 and eval_id(9) == -10


def test_nothing_flows_before_training_starts_then_admission_fills_the_bound():
    s = make(eta=1, b=2, mc=8)
    assert s.poll() == []
    s.start_training()
    submits = s.poll()
    # (eta + version + 1) * B = 4 prompts, spread over the generators, least loaded first.
    assert kinds(submits) == [Submit] * 4
    assert [c.generator for c in submits] == [4, 5, 4, 5]
    assert [c.prompt_id for c in submits] == [0, 1, 2, 3]
    assert len({c.seed for c in submits}) == 4
    assert s.poll() == []


def test_a_batch_trains_once_complete_and_the_step_moves_the_weights():
    s = make(eta=1, b=2)
    s.start_training()
    submits = s.poll()
    assert finish(s, submits[:1]) == []
    assert s.poll() == []  # one complete group: not a batch
    finish(s, submits[1:2])
    train = s.poll()
    assert kinds(train) == [Train]
    assert train[0].version == 0 and [g.prompt_id for g in train[0].groups] == [0, 1]
    assert s.trainer_busy and s.generator_busy(4)
    finish(s, submits[2:])
    assert not any(isinstance(c, Train) for c in s.poll())  # one step at a time
    done = s.on_step_done(1)
    assert kinds(done) == [StepFinished, SyncWeights] and done[1].version == 1
    assert not s.generator_busy(4)  # it still serves version 0
    out = sync(s, 1)
    assert kinds(out) == [WeightsVerified, WeightsVerified, SyncFinished]
    assert s.generator_busy(4) or s.generators.load[4] == 0
    with pytest.raises(RuntimeError, match="no such step"):
        s.on_step_done(5)


def test_weights_that_differ_from_what_was_sent_are_named():
    s = make(stages=2)
    s.sync_weights()
    assert s.on_weights_loaded(4, 0, {"a": "1", "b": "2"}) == []  # stage 1 has not reported yet
    assert s.on_weights_sent(0, 0, {"a": "1"}) == []
    with pytest.raises(WeightMismatch, match="generator rank 4 loaded version 0 with 1 tensor"):
        s.on_weights_sent(1, 0, {"b": "3"})


def test_eval_rounds_count_samples_and_free_their_generators():
    s = make(k=2, eval_interval=1)
    submits = s.start_eval()
    assert [c.prompt_id for c in submits] == [-1, -2, -3] and [c.row for c in submits] == [0, 1, 2]
    assert make().start_eval()[0].seed == submits[0].seed  # every round samples with the same seeds
    out = finish(s, submits)
    assert kinds(out) == [EvalFinished] and len(out[0].results) == 6 and s.eval is None
    assert s.generators.load == {4: 0, 5: 0}
    with pytest.raises(RuntimeError, match="unexpected held-out result"):
        s.on_trajectory(sample(-1, 0))


def test_an_eval_round_waits_for_eval_samples_per_prompt():
    s = make(k=2, eval_samples=3)
    submits = s.start_eval()
    out = []
    for c in submits:
        for i in range(2):  # group_size samples are not enough
            out += s.on_trajectory(sample(c.prompt_id, i))
    assert out == [] and s.eval is not None
    for c in submits:
        out += s.on_trajectory(sample(c.prompt_id, 2))
    assert kinds(out) == [EvalFinished] and len(out[0].results) == 9


def test_an_eval_round_starts_when_every_generator_serves_an_eval_version():
    s = make(eval_interval=1, total=3)
    s.start_training()
    finish(s, s.poll()[:2])
    s.poll()
    s.on_step_done(1)
    out = sync(s, 1)
    assert kinds(out)[-3:] == [Submit] * 3 and s.eval is not None and s.eval.version == 1


def test_a_checkpoint_waits_for_the_step_boundary_and_a_stop_for_the_checkpoint():
    s = make(eta=1, b=2)
    s.start_training()
    submits = s.poll()
    finish(s, submits[:2])
    assert kinds(s.poll()) == [Train]
    s.request_checkpoint(stop=True)
    assert s.poll() == []  # the step in flight completes first
    s.on_step_done(1)
    assert kinds(s.poll()) == [Checkpoint]  # and then nothing is admitted: a stop is pending
    assert not s.finished()  # the checkpoint and the weight update are in flight
    s.on_checkpoint_saved()
    sync(s, 1)
    assert s.finished()
    state = s.state_dict()
    assert state["staleness"]["version"] == 1 and state["stream"]["returned"] == [2, 3]


def test_version_zero_is_never_checkpointed():
    s = make()
    s.request_checkpoint()
    assert s.poll() == []


def test_a_batch_ready_when_a_checkpoint_starts_stays_in_its_state_until_it_is_saved():
    """The checkpoint's state is taken after the poll that decided it: a batch dispatched in that
    same poll would be in neither the buffer nor the ledger of a resumed run (CI lost 4 prompts)."""
    s = make(eta=2, b=2, total=4)
    s.start_training()
    submits = s.poll()
    finish(s, submits[:2])
    assert kinds(s.poll()) == [Train]
    finish(s, submits[2:4])  # the next batch is complete while step 0 trains
    s.request_checkpoint()
    s.on_step_done(1)
    sync(s, 1)
    out = s.poll()
    assert Checkpoint in kinds(out) and Train not in kinds(out)
    state = s.state_dict()
    assert sorted(g["prompt_id"] for g in state["buffer"]["ready"]) == [2, 3]
    assert not any(isinstance(c, Train) for c in s.poll())  # not while the trainer saves
    s.on_checkpoint_saved()
    train = [c for c in s.poll() if isinstance(c, Train)]
    assert [g.prompt_id for g in train[0].groups] == [2, 3]


def test_a_skipped_checkpoint_lets_training_go_on_and_leaves_the_last_one_the_resume_point():
    s = make(eta=2, b=2, total=4)
    s.start_training()
    submits = s.poll()
    finish(s, submits[:2])
    assert kinds(s.poll()) == [Train]
    finish(s, submits[2:4])
    s.request_checkpoint()
    s.on_step_done(1)
    sync(s, 1)
    assert Checkpoint in kinds(s.poll())
    s.on_checkpoint_skipped()
    assert s.last_ckpt_version == -1 and not s.ckpt_requested
    assert [g.prompt_id for c in s.poll() if isinstance(c, Train) for g in c.groups] == [2, 3]
    with pytest.raises(RuntimeError, match="none was being saved"):
        s.on_checkpoint_skipped()


def test_a_lost_generators_prompts_go_to_the_others_once_and_updates_stop_waiting_for_it():
    s = make(eta=1, b=2, k=2, total=2)
    s.start_training()
    submits = s.poll()  # prompts 0, 2 on generator 4; 1, 3 on generator 5
    on5 = [c for c in submits if c.generator == 5]
    s.on_trajectory(sample(on5[0].prompt_id, 0))  # half of prompt 1 arrived before the loss
    again = s.lose_generator(5)
    assert s.alive == (4,) and s.lost == [5] and not s.stop_requested
    # Same prompts, rows and seeds, now on generator 4; nothing newly admitted.
    assert [(c.generator, c.prompt_id, c.row, c.seed) for c in again] == [(4, c.prompt_id, c.row, c.seed) for c in on5]
    assert s.poll() == [] and s.generators.load == {4: 4}
    finish(s, [c for c in submits if c.generator == 4])
    finish(s, again)  # sample 0 of prompt 1 again: the lost one was dropped, not a duplicate
    train = s.poll()
    assert kinds(train) == [Train] and [g.prompt_id for g in train[0].groups] == [0, 1]
    done = s.on_step_done(1)
    assert done[1] == SyncWeights(1, (4,), group=1)  # new members: new groups
    s.on_weights_sent(0, 1, {"w": "x"})
    assert kinds(s.on_weights_loaded(4, 1, {"w": "x"})) == [WeightsVerified, SyncFinished]
    with pytest.raises(RuntimeError, match="not a live generator"):
        s.lose_generator(5)


def test_a_step_that_ends_after_the_last_generator_is_lost_moves_no_weights_and_checkpoints():
    """Seen in CI: the last generator died while a step trained; the step's update then went to a
    weight group of the trainer alone, which the trainer refused, and the run crashed instead of
    checkpointing and stopping."""
    s = make(eta=1, b=2, k=2, total=3)
    s.start_training()
    finish(s, s.poll())
    assert kinds(s.poll()) == [Train]
    s.lose_generator(5)
    s.lose_generator(4)
    assert s.alive == () and s.stop_requested
    assert kinds(s.on_step_done(1)) == [StepFinished]  # no SyncWeights to nobody
    assert s.poll() == [Checkpoint(1, hf=False)]


def test_a_replacement_joins_at_the_next_update_and_gets_prompts_once_it_serves_that_version():
    s = make(eta=1, b=2, k=2, total=3)
    s.start_training()
    s.poll()
    s.lose_generator(5)
    s.join_generator(5)  # a new process took rank 5
    assert s.alive == (4,) and s.generators.load == {4: 4}
    finish(s, list(s.where.values()))
    s.poll()
    assert s.on_step_done(1)[1] == SyncWeights(1, (4, 5), group=1)  # the replacement is in the update
    submits = [c for c in s.poll() if isinstance(c, Submit)]
    assert submits and all(c.generator == 4 for c in submits)  # not given prompts before it serves version 1
    s.on_weights_sent(0, 1, {"w": "x"})
    assert kinds(s.on_weights_loaded(4, 1, {"w": "x"})) == [WeightsVerified]  # waits for the replacement
    assert kinds(s.on_weights_loaded(5, 1, {"w": "x"})) == [WeightsVerified, SyncFinished]
    assert s.alive == (4, 5) and s.joining == set() and s.served[5] == 1
    assert s.generators.least_loaded() == 5 and s.lost == [5]
    with pytest.raises(RuntimeError, match="in the run already"):
        s.join_generator(5)


def test_a_round_that_broke_retires_its_groups_even_when_the_members_are_the_same_again():
    """Generator 5 dies mid-transfer and a replacement takes rank 5 before the round is settled:
    the members are the same as before, but the groups broke, so every side makes new ones."""
    s = make()
    assert s.sync_weights() == [SyncWeights(0, (4, 5), group=0)]
    s.on_weights_sent(0, 0, {}, error="Connection reset by peer")
    s.lose_generator(5)
    s.join_generator(5)
    assert s.on_weights_loaded(4, 0, {}, error="Connection reset by peer") == [SyncWeights(0, (4, 5), group=1)]
    s.on_weights_sent(0, 0, {"w": "x"})
    s.on_weights_loaded(4, 0, {"w": "x"})
    assert kinds(s.on_weights_loaded(5, 0, {"w": "x"})) == [WeightsVerified, SyncFinished]
    assert s.sync_weights() == [SyncWeights(0, (4, 5), group=1)]  # unbroken, same members: kept


def test_a_replacement_lost_before_it_served_leaves_the_update_and_hands_on_nothing():
    s = make()
    s.lose_generator(5)
    s.join_generator(5)
    assert s.sync_weights() == [SyncWeights(0, (4, 5), group=1)]  # rank 5 is another process now
    s.on_weights_sent(0, 0, {"w": "x"})
    s.on_weights_loaded(4, 0, {"w": "x"})
    assert kinds(s.lose_generator(5)) == [SyncFinished]
    assert s.alive == (4,) and s.joining == set() and s.lost == [5] and not s.stop_requested


def test_an_update_in_flight_finishes_without_the_lost_generator():
    s = make()
    s.sync_weights()
    s.on_weights_sent(0, 0, {"w": "x"})
    assert kinds(s.on_weights_loaded(4, 0, {"w": "x"})) == [WeightsVerified]
    assert kinds(s.lose_generator(5)) == [SyncFinished] and not s.syncing


def test_a_lost_generators_held_out_prompts_are_sampled_again_whole():
    s = make(k=2)
    submits = s.start_eval()
    lost = [c for c in submits if c.generator == 5]
    s.on_trajectory(sample(lost[0].prompt_id, 0))
    again = s.lose_generator(5)
    assert [c.prompt_id for c in again] == [c.prompt_id for c in lost]
    out = finish(s, [c for c in submits if c.generator == 4]) + finish(s, again)
    assert kinds(out) == [EvalFinished] and len(out[0].results) == 6
    assert sorted((t.prompt_id, t.sample_index) for t in out[0].results) == sorted(
        (c.prompt_id, i) for c in submits for i in range(2))


def test_an_update_broken_by_a_lost_member_is_done_again_without_it():
    s = make()
    s.sync_weights()
    # Generator 5 dies mid-transfer: the stage's send fails, generator 4's receive fails.
    assert s.on_weights_sent(0, 0, {}, error="Connection reset by peer") == []
    assert s.on_weights_loaded(4, 0, {}, error="Connection reset by peer") == []
    again = s.lose_generator(5)  # every live party reported: a new round, without it
    assert again == [SyncWeights(0, (4,), group=1)] and s.syncing
    s.on_weights_sent(0, 0, {"w": "x"})
    assert kinds(s.on_weights_loaded(4, 0, {"w": "x"})) == [WeightsVerified, SyncFinished]
    with pytest.raises(RuntimeError, match="no such update"):
        s.on_weights_loaded(4, 0, {}, error="late")


def test_a_round_waits_for_every_live_party_before_it_is_done_again():
    s = make()
    s.sync_weights()
    s.on_weights_loaded(4, 0, {"w": "x"})  # received everything before the sender failed
    assert s.on_weights_sent(0, 0, {}, error="broken") == []  # generator 5 has not reported
    assert s.lose_generator(5) == [SyncWeights(0, (4,), group=1)]


def test_a_broken_update_behind_a_newer_step_is_left_to_that_steps_update():
    s = make(eta=1, b=2, total=3)
    s.start_training()
    finish(s, s.poll())
    s.poll()
    s.on_step_done(1)  # update of version 1 in flight
    s.poll()  # and the next step training
    assert s.step is not None
    s.on_weights_sent(0, 1, {}, error="broken")
    s.on_weights_loaded(4, 1, {}, error="broken")
    again = s.lose_generator(5)
    assert kinds(again) == [Submit] * len(again) and not s.syncing  # not sent again: the trainer moved on
    assert s.on_step_done(2)[1] == SyncWeights(2, (4,), group=1)


def test_the_next_update_waits_until_a_broken_one_is_settled():
    s = make(eta=1, b=2, total=3)
    s.start_training()
    finish(s, s.poll())
    s.poll()
    s.on_step_done(1)
    s.on_weights_sent(0, 1, {}, error="broken")  # generator 5 failed; its loss is not known yet
    assert Train in kinds(s.poll())
    assert s.on_step_done(2)[1:] == [] and s.sync_due  # no update to a group with it again
    s.on_weights_loaded(4, 1, {}, error="broken")
    out = s.lose_generator(5)
    assert SyncWeights(2, (4,), group=1) in out and not s.sync_due


def test_fewer_than_min_generators_left_checkpoints_and_stops():
    s = make(eta=1, b=2, min_generators=2)
    s.start_training()
    s.poll()
    s.lose_generator(4)
    assert s.stop_requested and s.ckpt_requested
    assert s.lose_generator(5) == []  # none left: the checkpoint issues their prompts again
    assert s.alive == ()


def test_losing_the_last_generator_an_update_waits_for_starts_no_eval_round():
    """The update finishes with nobody left to serve an eval round that falls due with it."""
    s = make(eval_interval=1)
    s.sync_weights()
    s.on_weights_sent(0, 0, {"w": "x"})
    s.on_weights_loaded(4, 0, {"w": "x"})
    s.lose_generator(4)
    assert kinds(s.lose_generator(5)) == [SyncFinished] and s.eval is None and s.alive == ()


def test_a_run_that_can_never_go_on_is_named_not_left_to_hang():
    s = make(eta=1, b=2, total=3)
    s.start_training()
    submits = s.poll()
    assert s.stalled() is None  # prompts in flight
    finish(s, submits)
    assert kinds(s.poll()) == [Train]
    assert s.stalled() is None  # a step in flight
    s.on_step_done(1)
    sync(s, 1)
    s.buffer.pop_batch(2)  # complete groups lost, as a checkpoint once lost them
    finish(s, s.poll())  # the two prompts the bound still admits
    assert kinds(s.poll()) == [Train]
    s.on_step_done(2)
    sync(s, 2)
    assert s.poll() == []
    assert s.stalled() == ("at version 2 of 3 no prompt is in flight and 0 complete of the 2 a batch needs"
                           " wait; 6 prompts accepted of the 6 the run needs")

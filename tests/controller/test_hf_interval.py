"""Which checkpoints hold a Hugging Face export (checkpoint.hf_interval), decided by the scheduler."""

from __future__ import annotations

import pytest

from areal_hpc.controller.scheduler import Checkpoint, Policy, Scheduler, Train
from areal_hpc.wire.messages import Trajectory

GENERATORS = [4, 5]


def checkpoints_of_a_run(total: int, every: int, hf_every: int) -> list[tuple[int, bool]]:
    """(version, hf) of every checkpoint a whole run asks for, each saved at once."""
    s = Scheduler(Policy(1, 2, 1, 8, "strict", total, checkpoint_interval=every, hf_interval=hf_every),
                  GENERATORS, train_size=50, held_out_size=1)
    s.start_training()
    saved = []
    for _ in range(100 * total):
        if s.finished():
            return saved
        for c in s.poll():
            if isinstance(c, Train):
                s.on_step_done(c.version + 1)
                s.on_weights_sent(0, c.version + 1, {})
                for g in GENERATORS:
                    s.on_weights_loaded(g, c.version + 1, {})
            elif isinstance(c, Checkpoint):
                saved.append((c.version, c.hf))
                s.on_checkpoint_saved()
            elif c.prompt_id >= 0:  # a Submit: its one sample comes back at once
                s.on_trajectory(Trajectory(c.prompt_id, 0, [1], [2], [0.0], [0], "stop"))
    raise AssertionError(f"the run did not finish: at version {s.version}")


@pytest.mark.parametrize("total, every, hf_every, expected", [
    # Off: checkpoints as before, none with an export, and no extra one at the end.
    (5, 2, 0, [(2, False), (4, False)]),
    # Multiples of hf_interval, and the last version although 5 is none.
    (5, 2, 2, [(2, True), (4, True), (5, True)]),
    # Independent of interval_steps: an export step off it is checkpointed for the export.
    (6, 2, 3, [(2, False), (3, True), (4, False), (6, True)]),
    (4, 0, 4, [(4, True)]),
])
def test_exports_at_multiples_of_hf_interval_and_the_last_version(total, every, hf_every, expected):
    assert checkpoints_of_a_run(total, every, hf_every) == expected


def test_a_requested_checkpoint_holds_an_export_only_when_one_is_due():
    s = Scheduler(Policy(1, 2, 1, 8, "strict", 10, hf_interval=3), GENERATORS, train_size=50, held_out_size=1)
    assert [s.hf_due(v) for v in (1, 2, 3, 6, 9, 10, 11)] == [False, False, True, True, True, True, True]

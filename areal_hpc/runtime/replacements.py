"""Rank 0's side of replacement generators: processes that join the running job in a lost one's place.

Rank 0 writes `logging.dir/join.json` (its lifeline address and the job's secret, readable by the
owner only) for `python -m areal_hpc.launch --join RUN_DIR` to find it. A process that connects is
a spare: rank 0 sends it the launch plan at once, and it starts its engine and reward pool while
it waits, so a spare started ahead of a loss (by hand, or by a script) replaces a lost generator
within one weight update, not after a model load. When a generator rank is vacant (lost, and its
process gone), the oldest spare is offered it (JoinOffer). Under SLURM the batch scripts start
cluster.spare_nodes' spares as a step of a third component (`python -m areal_hpc.launch --spare
CONFIG`). At most `rollout.max_replacements` replacements are offered in a run; spares beyond
that are refused.

Cost at any scale: one socket and one launch plan (the config: kilobytes) per spare, nothing per
rank of the world.
"""

from __future__ import annotations

import json
import logging
import os
from collections import deque
from pathlib import Path

from areal_hpc.controller.checkpoint import write_atomic
from areal_hpc.wire.lifeline import LifelineServer
from areal_hpc.wire.link import Link
from areal_hpc.wire.messages import LaunchPlan, Shutdown, WorkerFailed

log = logging.getLogger(__name__)
JOIN_FILE = "join.json"
# Names this run of the job in the join file (the SLURM scripts set it to JOB_ID.RESTART_COUNT),
# so that a spare started beside the ranks waits for this run's rank 0, not a crashed one's file.
RUN_ID_ENV = "AREAL_RUN_ID"


class Replacements:
    def __init__(self, run_dir: Path, lifelines: LifelineServer, plan: LaunchPlan) -> None:
        self.lifelines, self.plan = lifelines, plan
        self.budget = plan.config.rollout.max_replacements
        self.offered = 0
        self.spares: deque[Link] = deque()
        self.run_dir = Path(run_dir).resolve()
        self.join_file = self.run_dir / JOIN_FILE
        if self.budget > 0:
            info = {"address": list(lifelines.address), "secret": lifelines.secret, "run": os.environ.get(RUN_ID_ENV)}
            write_atomic(self.join_file, json.dumps(info), mode=0o600)

    @property
    def left(self) -> int:
        return self.budget - self.offered

    def match(self, vacant: list[int]) -> list[tuple[int, Link]]:
        """Spares for vacant ranks (lowest first, oldest spare first), within the budget; refuses
        spares beyond it."""
        for sock in self.lifelines.joins():
            link = Link(sock)
            link.send(self.plan)
            self.spares.append(link)
        for link in list(self.spares):
            for msg in link.receive():  # before its offer a spare only reports a failure
                if isinstance(msg, WorkerFailed):
                    log.warning("a spare generator failed before it was needed: %s", msg.reason)
                    link.close()
            if link.closed:
                self.spares.remove(link)
        while self.spares and self.left <= 0:
            self._refuse(self.spares.popleft(), f"no replacement left to offer (rollout.max_replacements ="
                                                 f" {self.budget} used)")
        out = []
        for rank in sorted(vacant):
            if not self.spares or self.left <= 0:
                break
            out.append((rank, self.spares.popleft()))
            self.lifelines.expect(rank)  # the replacement greets as `rank` once it took the offer
            self.offered += 1
        return out

    @staticmethod
    def _refuse(link: Link, why: str) -> None:
        link.send(Shutdown(why))
        link.receive()
        link.close()

    def close(self, reason: str) -> None:
        """The run ends: spares are told so, and join.json goes."""
        while self.spares:
            self._refuse(self.spares.popleft(), reason)
        self.join_file.unlink(missing_ok=True)

"""The replay buffer: samples of one prompt kept together, finished groups handed out oldest first.

A group opens when its prompt is submitted and completes when all `size` samples came back. Only
complete groups can be trained (group-relative advantages need every sample of a prompt), and the
batch takes the groups submitted earliest, so the oldest data is consumed first.
"""

from __future__ import annotations

import heapq
from collections import Counter
from dataclasses import dataclass, field

from areal_hpc.wire.messages import Trajectory


def trainable(groups: list[Group]) -> tuple[list[Trajectory], list[Trajectory]]:
    """A batch's samples split into those the trainer learns from and those the reward service
    failed on (Trajectory.reward_infra: a worker that died or hung, not a wrong answer). Scoring
    those wrong would punish responses for the infrastructure's fault; they are left out, and
    their prompt's other samples keep their group-relative advantages among themselves."""
    kept: list[Trajectory] = []
    failed: list[Trajectory] = []
    for group in groups:
        for t in group.trajectories:
            (failed if t.reward_infra else kept).append(t)
    return kept, failed


@dataclass
class Group:
    prompt_id: int
    # Policy version when the prompt was submitted, and its submission order.
    version: int
    seq: int
    size: int
    # Sample i at index i once it arrived (None until then).
    trajectories: list[Trajectory | None] = field(default_factory=list)
    # Bit i set: sample i arrived (a duplicate is caught in O(1)).
    arrived: int = 0

    def __post_init__(self) -> None:
        if not self.trajectories:
            self.trajectories = [None] * self.size

    @property
    def complete(self) -> bool:
        return self.arrived == (1 << self.size) - 1


def _take(counts: Counter[int], version: int) -> None:
    """One prompt fewer at `version`; a version with none left is dropped, so the gate's loop
    sees only versions still present."""
    counts[version] -= 1
    if not counts[version]:
        del counts[version]


class TrajectoryBuffer:
    def __init__(self) -> None:
        self._running: dict[int, Group] = {}
        self._ready: list[tuple[int, int, Group]] = []  # heap of (seq, prompt_id, group)
        self._seq = 0
        # Prompts per submission version, for the staleness gate without a sort per turn.
        self.running_versions: Counter[int] = Counter()
        self.ready_versions: Counter[int] = Counter()
        # Bumped whenever those counts change: a gate computed from them stays valid until then.
        self.revision = 0

    def open(self, prompt_id: int, version: int, size: int) -> Group:
        if prompt_id in self._running:
            raise KeyError(f"prompt {prompt_id} is already running")
        group = Group(prompt_id, version, self._seq, size)
        self._seq += 1
        self._running[prompt_id] = group
        self.running_versions[version] += 1
        self.revision += 1
        return group

    def add(self, traj: Trajectory) -> Group | None:
        """Store one sample; returns its group when this sample completed it."""
        group = self._running.get(traj.prompt_id)
        if group is None:
            raise KeyError(f"sample of prompt {traj.prompt_id}, which is not running")
        i = traj.sample_index
        if not 0 <= i < group.size:
            raise KeyError(f"sample {i} of prompt {traj.prompt_id}, which has {group.size} samples")
        if group.arrived >> i & 1:
            raise KeyError(f"sample {i} of prompt {traj.prompt_id} arrived twice")
        group.arrived |= 1 << i
        group.trajectories[i] = traj
        if not group.complete:
            return None
        del self._running[traj.prompt_id]
        _take(self.running_versions, group.version)
        self._push_ready(group)
        return group

    def restart(self, prompt_id: int) -> None:
        """Drop the samples of running prompt `prompt_id` so far (its generator was lost and the
        prompt is generated again); it keeps its submission version and order."""
        group = self._running[prompt_id]
        group.arrived = 0
        group.trajectories = [None] * group.size

    def _push_ready(self, group: Group) -> None:
        heapq.heappush(self._ready, (group.seq, group.prompt_id, group))
        self.ready_versions[group.version] += 1
        self.revision += 1

    @property
    def ready(self) -> int:
        """Complete groups waiting to be trained."""
        return len(self._ready)

    @property
    def running(self) -> int:
        return len(self._running)

    def running_ids(self) -> list[int]:
        """Prompts in flight, in submission order."""
        return [g.prompt_id for g in sorted(self._running.values(), key=lambda g: g.seq)]

    def ready_ids(self) -> list[int]:
        return [pid for _, pid, _ in sorted(self._ready)]

    def pop_batch(self, n: int) -> list[Group]:
        """The `n` complete groups submitted earliest."""
        if n > len(self._ready):
            raise ValueError(f"asked for {n} groups but only {len(self._ready)} are complete")
        batch = [heapq.heappop(self._ready)[2] for _ in range(n)]
        for group in batch:
            _take(self.ready_versions, group.version)
        self.revision += 1
        return batch

    def state_dict(self) -> dict:
        """Complete groups only: running prompts go back to the queue on resume."""
        return {"seq": self._seq, "ready": [{**vars(g), "trajectories": [t.to_state() for t in g.trajectories]}
                                            for _, _, g in sorted(self._ready)]}

    @classmethod
    def from_state(cls, state: dict) -> TrajectoryBuffer:
        buf = cls()
        buf._seq = state["seq"]
        for g in state["ready"]:
            group = Group(**{**g, "trajectories": [Trajectory.from_state(t) for t in g["trajectories"]]})
            buf._push_ready(group)
        return buf

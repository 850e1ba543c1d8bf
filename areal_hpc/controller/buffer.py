"""The replay buffer: samples of one prompt kept together, finished groups handed out oldest first.

A group opens when its prompt is submitted and completes when all `size` samples came back. Only
complete groups can be trained (group-relative advantages need every sample of a prompt), and the
batch takes the groups submitted earliest, so the oldest data is consumed first.
"""

from __future__ import annotations

import heapq
from dataclasses import asdict, dataclass, field

from areal_hpc.runtime.messages import Trajectory


@dataclass
class Group:
    prompt_id: int
    # Policy version when the prompt was submitted, and its submission order.
    version: int
    seq: int
    size: int
    trajectories: list[Trajectory] = field(default_factory=list)

    @property
    def complete(self) -> bool:
        return len(self.trajectories) == self.size


class TrajectoryBuffer:
    def __init__(self) -> None:
        self._running: dict[int, Group] = {}
        self._ready: list[tuple[int, int, Group]] = []  # heap of (seq, prompt_id, group)
        self._seq = 0

    def open(self, prompt_id: int, version: int, size: int) -> Group:
        if prompt_id in self._running:
            raise KeyError(f"prompt {prompt_id} is already running")
        group = Group(prompt_id, version, self._seq, size)
        self._seq += 1
        self._running[prompt_id] = group
        return group

    def add(self, traj: Trajectory) -> Group | None:
        """Store one sample; returns its group when this sample completed it."""
        group = self._running.get(traj.prompt_id)
        if group is None:
            raise KeyError(f"sample of prompt {traj.prompt_id}, which is not running")
        if any(t.sample_index == traj.sample_index for t in group.trajectories):
            raise KeyError(f"sample {traj.sample_index} of prompt {traj.prompt_id} arrived twice")
        group.trajectories.append(traj)
        if not group.complete:
            return None
        del self._running[traj.prompt_id]
        group.trajectories.sort(key=lambda t: t.sample_index)
        heapq.heappush(self._ready, (group.seq, group.prompt_id, group))
        return group

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

    def versions_after(self, n: int) -> list[int]:
        """Submission versions of the prompts left untrained if the `n` oldest complete groups were
        trained now: every running group and the newer complete ones."""
        newer = sorted(self._ready)[n:]
        return [g.version for g in self._running.values()] + [g.version for _, _, g in newer]

    def pop_batch(self, n: int) -> list[Group]:
        """The `n` complete groups submitted earliest."""
        if n > len(self._ready):
            raise ValueError(f"asked for {n} groups but only {len(self._ready)} are complete")
        return [heapq.heappop(self._ready)[2] for _ in range(n)]

    def state_dict(self) -> dict:
        """Complete groups only: running prompts go back to the queue on resume."""
        return {"seq": self._seq, "ready": [asdict(g) for _, _, g in sorted(self._ready)]}

    @classmethod
    def from_state(cls, state: dict) -> TrajectoryBuffer:
        buf = cls()
        buf._seq = state["seq"]
        for g in state["ready"]:
            group = Group(**{**g, "trajectories": [Trajectory(**t) for t in g["trajectories"]]})
            heapq.heappush(buf._ready, (group.seq, group.prompt_id, group))
        return buf

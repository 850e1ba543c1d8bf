"""The staleness bound of asynchronous RL: which generation requests may start, which batch may train.

Counted in prompts (one request = one prompt = `group_size` trajectories), with B the prompts of
one training batch. A request may start while

    capacity = min(max_concurrent - running, (eta + version + 1) * B - (accepted + running)) > 0,

the paper's rule floor((N_r - 1) / B) <= version + eta in capacity form; eta = 0 is synchronous
RL. Admission alone does not bound the staleness of a slow prompt: faster prompts admitted after
it could fill the batches while it is still generating. Two training gates (rollout.staleness_gate):
- "strict": a batch trained at `version` also waits until every prompt left untrained after it
  can still be trained in time: prompt P submitted at version v_P must be trained at a version
  <= v_P + eta, and later batches have B slots each (an earliest-deadline-first feasibility check).
  Every trained prompt then started at a version >= version - eta, and the trainer waits for a
  straggler when it must.
- "admission" (AReaL's rule): a complete batch trains at once; only admission is bounded, so a
  straggler may be trained more than eta versions after it started, and the trainer never waits
  for one. With eta = 0 both are synchronous RL: admission lets only the current batch start.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import asdict, dataclass


@dataclass
class StalenessManager:
    eta: int
    batch_prompts: int
    max_concurrent: int
    # Training gate, "strict" or "admission" (see the module docstring).
    gate: str = "strict"
    # Policy version: training steps completed.
    version: int = 0
    # Prompts whose every sample came back and was kept, since the start of training.
    accepted: int = 0
    # Prompts submitted and not yet accepted or rejected.
    running: int = 0

    def capacity(self) -> int:
        """How many more prompts may be submitted now (<= 0: none)."""
        bound = (self.eta + self.version + 1) * self.batch_prompts - (self.accepted + self.running)
        return min(self.max_concurrent - self.running, bound)

    def submit(self, n: int = 1) -> None:
        if n > self.capacity():
            raise RuntimeError(f"submitting {n} prompts exceeds the capacity {self.capacity()}")
        self.running += n

    def accept(self, n: int = 1) -> None:
        if n > self.running:
            raise RuntimeError(f"finishing {n} prompts but only {self.running} are running")
        self.running -= n
        self.accepted += n

    def set_version(self, version: int) -> None:
        if version < self.version:
            raise RuntimeError(f"policy version went back from {self.version} to {version}")
        self.version = version

    @property
    def strict(self) -> bool:
        """Whether a ready batch may wait for stragglers (the strict gate)."""
        return self.gate == "strict"

    def may_train(self, running: Mapping[int, int], ready: Mapping[int, int]) -> bool:
        """Whether the oldest complete batch may train at the current version, given the prompts
        in flight and the complete ones, as counts per submission version. The batch takes the
        oldest complete prompts, which have the lowest versions. O(distinct versions), at most
        eta + 2 of them under the bound, whatever the number of prompts in flight."""
        if not self.strict:
            return True
        skip, left = self.batch_prompts, 0
        for v in sorted(running.keys() | ready.keys()):
            taken = min(skip, ready.get(v, 0))
            skip -= taken
            count = running.get(v, 0) + ready.get(v, 0) - taken
            left += count
            # Prompts submitted at <= v must fit in the batches of versions version+1 .. v+eta.
            if count and left > (v + self.eta - self.version) * self.batch_prompts:
                return False
        return True

    def state_dict(self) -> dict:
        """Counters for a checkpoint. Running prompts go back to the queue on resume, so they are
        saved as not running."""
        state = asdict(self)
        state["running"] = 0
        return state

    @classmethod
    def from_state(cls, state: dict, eta: int, batch_prompts: int, max_concurrent: int,
                   gate: str = "strict") -> StalenessManager:
        """Resume the counters; the bound's parameters come from the (possibly changed) config."""
        return cls(eta, batch_prompts, max_concurrent, gate, version=state["version"], accepted=state["accepted"])

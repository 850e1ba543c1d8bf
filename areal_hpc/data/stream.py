"""The order in which training prompts are issued: an endless, reproducible stream of prompt ids.

Prompt id p is the p-th prompt issued: epoch p // n, position p % n of that epoch's permutation
(seeded by seed and epoch). So the stream's whole state is its position plus the ids handed back
by a resume (prompts that were in flight when the checkpoint was taken), which are issued first.
"""

from __future__ import annotations

import random
from collections import deque


class PromptStream:
    def __init__(self, size: int, seed: int, shuffle: bool = True) -> None:
        if size < 1:
            raise ValueError("the prompt data set is empty")
        self.size = size
        self.seed = seed
        self.shuffle = shuffle
        self.position = 0
        self._returned: deque[int] = deque()
        self._perm: tuple[int, list[int]] | None = None

    def _permutation(self, epoch: int) -> list[int]:
        if self._perm is None or self._perm[0] != epoch:
            order = list(range(self.size))
            if self.shuffle:
                random.Random(f"{self.seed}/{epoch}").shuffle(order)
            self._perm = (epoch, order)
        return self._perm[1]

    def index(self, prompt_id: int) -> int:
        """The data-set row of a prompt id."""
        epoch, pos = divmod(prompt_id, self.size)
        return self._permutation(epoch)[pos]

    def next(self) -> int:
        if self._returned:
            return self._returned.popleft()
        self.position += 1
        return self.position - 1

    def state_dict(self, reissue: list[int] | None = None) -> dict:
        """The position, and the prompts a resumed stream issues again before any new one:
        `reissue` (e.g. those in flight at a checkpoint), then any not yet re-issued."""
        return {"position": self.position, "returned": list(reissue or []) + list(self._returned)}

    def load_state_dict(self, state: dict) -> None:
        self.position = state["position"]
        self._returned = deque(state["returned"])

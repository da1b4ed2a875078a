"""Which prompt comes next: a seeded, epoch-wise shuffled stream over the train split with a
cursor that checkpoints, plus a front queue for examples that must be retried (a group
dropped for staleness or a scoring error goes back, so no prompt is silently lost).
Knows nothing of engines or models.
"""

from __future__ import annotations

import random
from collections import deque
from collections.abc import Callable

from reroll.rollout import Example


class PromptStream:
    def __init__(self, examples: list[Example], seed: int, cursor: int = 0,
                 retry: list[str] | None = None, choose: Callable[[int], Example] | None = None):
        """``choose``: a selector's ``draw number -> example`` in place of the shuffle."""
        if not examples:
            raise ValueError("the task's train split is empty")
        self.examples, self.seed, self.cursor, self.choose = examples, seed, cursor, choose
        self._by_id = {e.prompt_id: e for e in examples}
        self.retry: deque[str] = deque(retry or [])
        self._epoch, self._order = -1, []

    def _order_for(self, epoch: int) -> list[int]:
        if epoch != self._epoch:
            order = list(range(len(self.examples)))
            random.Random(self.seed * 1_000_003 + epoch).shuffle(order)
            self._epoch, self._order = epoch, order
        return self._order

    def next(self) -> Example:
        if self.retry:
            return self._by_id[self.retry.popleft()]
        if self.choose is not None:
            self.cursor += 1
            return self.choose(self.cursor - 1)
        n = len(self.examples)
        epoch, pos = divmod(self.cursor, n)
        self.cursor += 1
        return self.examples[self._order_for(epoch)[pos]]

    def push_front(self, example: Example) -> None:
        self.retry.append(example.prompt_id)

    def state(self) -> dict:
        return {"cursor": self.cursor, "retry": list(self.retry)}

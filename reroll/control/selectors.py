"""Prompt selectors: which prompt a new group gets. Uniform selection is `PromptStream`'s own
epoch-wise shuffle (``uniform``); the others are methods (`reroll.methods`: VADE, DOTS,
Prompt-GDRO).

Owns the ``SELECTORS`` registry. A selector is built as ``cls(examples, seed, round_size,
*, hyperparameters)`` and answers ``pick(draw, stats) -> Example`` for the ``draw``-th fresh
prompt of the run, reading the per-prompt statistics as of the last step boundary. Every
random choice is seeded by (run seed, draw or round), so a resumed run picks what an
uninterrupted one picked; what a selector caches between draws is in ``state``. Round-based
selectors (`Rounds`: DOTS, VADE) choose ``round_size`` distinct prompts at once from a
candidate pool. Knows nothing of engines, the scheduler or any method.
"""

from __future__ import annotations

import numpy as np

from reroll.control.stats import PromptStats
from reroll.registry import METHODS, Registry
from reroll.rollout import Example

SELECTORS = Registry("selector", plugins=METHODS)


class Selector:
    def __init__(self, examples: list[Example], seed: int, round_size: int, /):
        if not examples:
            raise ValueError("selector: the task's train split is empty")
        self.examples, self.seed, self.round_size = examples, seed, max(1, round_size)
        self.excluded: set[str] = set()  # prompts given up on (never picked again)

    def pick(self, draw: int, stats: PromptStats) -> Example:
        raise NotImplementedError

    def end_step(self, outcomes: list[tuple[str, int, int]], stats: PromptStats) -> None:
        pass

    def exclude(self, prompt_id: str) -> None:
        self.excluded.add(prompt_id)

    def state(self) -> dict:
        return {"excluded": sorted(self.excluded)}

    def load_state(self, d: dict) -> None:
        self.excluded = set(d.get("excluded", []))


class Rounds(Selector):
    """Picks ``round_size`` distinct prompts per round, the best by a seeded random key
    (Gumbel-top-k over log-weights, i.e. sampling without replacement in proportion to the
    weights), among ``pool`` candidates drawn uniformly (0: every prompt)."""

    def __init__(self, examples, seed, round_size, pool: int):
        super().__init__(examples, seed, round_size)
        self.pool = pool
        self.round, self.picks = -1, []

    def keys(self, cands: list[Example], stats: PromptStats, rng: np.random.Generator
             ) -> np.ndarray:
        raise NotImplementedError

    def pick(self, draw, stats):
        r, pos = divmod(draw, self.round_size)
        if r != self.round:
            rng = np.random.default_rng([self.seed, r, 7])
            n = len(self.examples)
            idx = (rng.choice(n, size=self.pool, replace=False) if 0 < self.pool < n
                   else np.arange(n))
            cands = [self.examples[i] for i in idx]
            keys = self.keys(cands, stats, rng)
            keys[[e.prompt_id in self.excluded for e in cands]] = -np.inf
            order = np.argsort(-keys, kind="stable")[: self.round_size]
            picks = [int(idx[i]) for i in order]
            while len(picks) < self.round_size:  # fewer candidates than a round: repeat
                picks += picks[: self.round_size - len(picks)]
            self.round, self.picks = r, picks
        return self.examples[self.picks[pos]]

    def state(self):
        return {**super().state(), "round": self.round, "picks": list(self.picks)}

    def load_state(self, d):
        super().load_state(d)
        self.round, self.picks = int(d.get("round", -1)), list(d.get("picks", []))


def gumbel(rng: np.random.Generator, n: int) -> np.ndarray:
    return -np.log(-np.log(rng.uniform(1e-12, 1.0, size=n)))

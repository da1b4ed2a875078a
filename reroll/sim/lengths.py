"""Response lengths of simulated groups: fixed, a parametric long tail (lognormal), or
resampled from a recorded run (the rollout store, `reroll.runlog.read_rollouts`).

A source is called with a random generator and a group size and returns that many
(prompt length, response length) pairs. Knows nothing of time or scheduling.
"""

from __future__ import annotations

import math
import random
from pathlib import Path

from reroll.sim.settings import SimSettings


class Lengths:
    def __init__(self, settings: SimSettings, max_new_tokens: int):
        self.max_new, self.prompt = max_new_tokens, settings.prompt_tokens
        self.kind = settings.lengths
        self.median = settings.length_median or max_new_tokens / 2
        self.sigma = settings.length_sigma
        self.recorded: list[list[tuple[int, int]]] = []
        if self.kind not in ("fixed", "lognormal"):
            self.recorded = recorded_groups(self.kind)
            if not self.recorded:
                raise ValueError(f"sim lengths: no recorded rollouts under {self.kind!r} "
                                 f"(a run directory with record_every > 0)")

    def group(self, rng: random.Random, size: int) -> list[tuple[int, int]]:
        """``size`` (prompt tokens, response tokens) pairs, responses in [1, max_new_tokens]."""
        if self.kind == "fixed":
            return [(self.prompt, self.max_new)] * size
        if self.kind == "lognormal":
            mu = math.log(self.median)
            return [(self.prompt, min(self.max_new, max(1, round(rng.lognormvariate(mu,
                                                                                   self.sigma)))))
                    for _ in range(size)]
        g = rng.choice(self.recorded)  # a recorded group, its members cycled to ``size``
        return [(p, min(self.max_new, r)) for p, r in (g[i % len(g)] for i in range(size))]

    def mean_response(self, rng: random.Random, n: int = 2000) -> float:
        """Mean response length over ``n`` draws (for reports)."""
        xs = [r for _, r in self.group(rng, n)]
        return sum(xs) / len(xs)


def recorded_groups(run_dir: str | Path) -> list[list[tuple[int, int]]]:
    """(prompt length, response length) of every member of every recorded group."""
    from reroll.runlog import read_rollouts

    out = []
    for _, g in read_rollouts(run_dir):
        pairs = [(r["prompt_len"], max(1, len(r["tokens"]) - r["prompt_len"]))
                 for r in g["rollouts"]]
        if pairs:
            out.append(pairs)
    return out

"""VADE: variance-aware prompt selection. Each prompt has a Beta posterior over its success
probability; each round draws p ~ Beta per candidate (Thompson sampling) and takes the
prompts with the largest Bernoulli variance p (1 - p), the ones whose groups most likely have
non-zero advantages. Where reroll differs: evidence is discounted by ``decay`` per step of
age toward the Beta(1, 1) prior (not toward zero), so the posterior follows the moving
policy; prompts are chosen in rounds from a seeded candidate pool.

Owns the rules (`beta_update`, `info_score`) and the ``vade`` selector.
"""

from __future__ import annotations

import numpy as np

from reroll.control.rules import fail, ranged
from reroll.control.selectors import SELECTORS, Rounds
from reroll.control.stats import PromptRecord
from reroll.registry import check_range


@ranged(alpha="(0, inf)", beta="(0, inf)", successes="[0, inf)", failures="[0, inf)",
        decay="[0, 1]")
def beta_update(alpha: float, beta: float, successes: float, failures: float, *,
                decay: float = 1.0, prior: tuple[float, float] = (1.0, 1.0)
                ) -> tuple[float, float]:
    """Posterior update with prior decay: alpha' = a0 + decay (alpha - a0) + successes,
    beta' = b0 + decay (beta - b0) + failures, with (a0, b0) = ``prior``. decay = 1 is the
    plain conjugate update; decay = 0 forgets all earlier evidence. Decay pulls toward the
    prior, not toward zero, so a posterior never loses its pseudo-counts."""
    if not isinstance(prior, (tuple, list)) or len(prior) != 2:
        raise fail("beta_update", "prior", "a pair (a0, b0)", prior)
    for i, v in enumerate(prior):
        err = check_range(f"beta_update: prior[{i}]", v, "(0, inf)")
        if err:
            raise ValueError(err)
    a0, b0 = float(prior[0]), float(prior[1])
    decay = float(decay)
    return (a0 + decay * (float(alpha) - a0) + float(successes),
            b0 + decay * (float(beta) - b0) + float(failures))


@ranged(p="[0, 1]")
def info_score(p: float) -> float:
    """Ranking score of a Thompson draw p: the Bernoulli variance p (1 - p), largest (0.25)
    at p = 0.5 where GRPO advantages are most often non-zero."""
    p = float(p)
    return p * (1.0 - p)


@SELECTORS.register("vade", ranges={"decay": "(0, 1]", "pool": "[0, inf)"})
class VADE(Rounds):
    """VADE: a Beta posterior over each prompt's success probability (Beta(1, 1) prior,
    observations discounted by ``decay`` per step of age so the posterior follows the moving
    policy); each round draws ``p ~ Beta`` per candidate (Thompson sampling) and takes the
    prompts with the largest ``p (1 - p)``: the ones whose groups most likely have reward
    variance."""

    def __init__(self, examples, seed, round_size, /, *, decay: float = 0.9, pool: int = 2048):
        super().__init__(examples, seed, round_size, pool)
        self.decay = decay

    def posterior(self, rec: PromptRecord | None, step: int) -> tuple[float, float]:
        a, b, at = 1.0, 1.0, None
        for s, succ, n in (rec.history if rec is not None else ()):
            d = 1.0 if at is None else self.decay ** (s - at)
            a, b = beta_update(a, b, succ, n - succ, decay=d)
            at = s
        if at is not None and step > at:
            a, b = beta_update(a, b, 0, 0, decay=self.decay ** (step - at))
        return a, b

    def keys(self, cands, stats, rng):
        step = max((r.last_step for _, r in stats.items()), default=0) + 1
        ab = np.array([self.posterior(stats.get(e.prompt_id), step) for e in cands])
        p = rng.beta(ab[:, 0], ab[:, 1])
        return p * (1.0 - p) + 1e-9 * rng.uniform(size=len(cands))  # ties broken at random

"""VADE: variance-aware prompt selection (2025, "VADE: Variance-Aware Dynamic Sampling via
Online Sample-Level Difficulty Estimation"). Rule in one line: each prompt has a Beta
posterior over its success probability, decayed toward its prior on two scales; each round
draws p ~ Beta per candidate (Thompson sampling) and takes the prompts with the largest
Bernoulli variance p (1 - p), the ones whose groups most likely have non-zero advantages.

The two decay scales, as we read the paper's two-scale prior decay (our assumption: the
exact form and constants are ours): a slow one, ``decay`` per training step of age, so
evidence fades while the policy moves whether or not the prompt is drawn again; and a fast
one, ``update_decay`` on the evidence already held each time the prompt is observed anew,
so a fresh group outweighs what an older policy did on the same prompt. Both pull toward
the Beta(1, 1) prior, not toward zero. ``update_decay = 1`` is reroll's earlier one-scale
variant.

Where reroll differs: prompts are chosen in rounds from a seeded candidate pool; the
posterior is rebuilt from the prompt's recorded history (`PromptRecord.history`, its last
``control.stats_keep`` observations) rather than kept incrementally.

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


@SELECTORS.register("vade", ranges={"decay": "(0, 1]", "update_decay": "(0, 1]",
                                      "pool": "[0, inf)"})
class VADE(Rounds):
    """VADE: a Beta posterior over each prompt's success probability (Beta(1, 1) prior;
    evidence discounted toward it by ``decay`` per step of age and by ``update_decay`` each
    time a newer observation of the prompt arrives, so the posterior follows the moving
    policy); each round draws ``p ~ Beta`` per candidate (Thompson sampling) and takes the
    prompts with the largest ``p (1 - p)``: the ones whose groups most likely have reward
    variance."""

    def __init__(self, examples, seed, round_size, /, *, decay: float = 0.9,
                 update_decay: float = 0.8, pool: int = 2048):
        super().__init__(examples, seed, round_size, pool)
        self.decay, self.update_decay = decay, update_decay

    def posterior(self, rec: PromptRecord | None, step: int) -> tuple[float, float]:
        a, b, at = 1.0, 1.0, None
        for s, succ, n in (rec.history if rec is not None else ()):
            d = 1.0 if at is None else self.decay ** (s - at) * self.update_decay
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

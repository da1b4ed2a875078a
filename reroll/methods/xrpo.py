"""XRPO: allocation by the confidence interval of a prompt's mean reward. One more sample is
worth the shrinkage it brings to the Student-t half-width of that mean, h(n) - h(n+1), plus
an exploration bonus for rarely sampled prompts; samples go where that gain is largest.
Where reroll differs: XRPO hands a batch's remaining budget out in rounds across prompts;
here each group decides alone against a shadow price ``mu`` (a group cannot see the others'
gains while they are still generating), the price moving so the mean group size meets the
budget. The interval is over success indicators, whatever the reward scale.

Owns the rules (`t_halfwidth`, `xrpo_gain`) and the ``xrpo`` allocator.
"""

from __future__ import annotations

import math
from functools import lru_cache

import numpy as np

from reroll.control.allocators import ALLOCATORS, ShadowPriced
from reroll.control.rules import ranged, reals


@lru_cache(maxsize=4096)
def _t_quantile(q: float, df: int) -> float:
    from scipy.stats import t  # lazy: scipy costs ~0.3 s to import and only XRPO needs it

    return float(t.ppf(q, df))


@ranged(std="[0, inf)", n="[0, inf)", alpha="(0, 1)")
def t_halfwidth(std: float, n: int, *, alpha: float = 0.05) -> float:
    """Confidence half-width h(n) = t_{1-alpha/2, n-1} * std / sqrt(n); ``inf`` for n < 2 (no
    degrees of freedom: the mean is not yet bounded at all)."""
    if n < 2:
        return math.inf
    return _t_quantile(1.0 - alpha / 2.0, n - 1) * float(std) / math.sqrt(n)


@ranged(alpha="(0, 1)", explore="[0, inf)", total="[0, inf)")
def xrpo_gain(values: list[float], *, alpha: float = 0.05, explore: float = 0.0,
              total: int = 0) -> float:
    """Allocation priority of a prompt: the expected shrinkage of its half-width from one
    more sample, h(n) - h(n+1) with the sample std s (ddof=1) of ``values``, plus a UCB bonus
    ``explore * sqrt(log(max(total, 2)) / n)`` (``total`` = samples drawn so far across
    prompts). ``inf`` for n < 2: such a prompt must be sampled.

    ``values`` are rewards in [0, 1] (correctness or a success fraction). When they are all
    equal (s = 0) the gain would be 0 and an all-wrong prompt would never be revisited, so s is
    replaced by a pseudo-std sqrt(p(1-p)) with the Beta(1,1)-smoothed success rate
    p = (sum(values) + 1) / (n + 2): e.g. four zeros give p = 1/6, s = sqrt(5)/6.
    """
    vals = reals("xrpo_gain", "values", values, 0.0, 1.0, nonempty=False)
    n = len(vals)
    if n < 2:
        return math.inf
    std = float(np.std(vals, ddof=1))
    if std == 0.0:
        p = (sum(vals) + 1.0) / (n + 2.0)
        std = math.sqrt(p * (1.0 - p))
    gain = t_halfwidth(std, n, alpha=alpha) - t_halfwidth(std, n + 1, alpha=alpha)
    return gain + float(explore) * math.sqrt(math.log(max(total, 2)) / n)


@ALLOCATORS.register("xrpo", ranges={"n0": "[2, inf)", "n_max": "[2, inf)",
                                       "chunk": "[1, inf)", "alpha": "(0, 1)",
                                       "explore": "[0, inf)", "mu": "[0, inf)",
                                       "lr": "[0, inf)"})
class XRPO(ShadowPriced):
    """XRPO-style allocation: ``n0`` samples first; then ``chunk`` more at a time while one
    more sample still shrinks the prompt's Student-t confidence half-width (plus an
    exploration bonus for rarely sampled prompts) by more than the shadow price ``mu``, up to
    ``n_max``. ``mu`` follows the budget (mean ``group_size`` samples per group). The
    interval is over success indicators (``control.success_at``), whatever the reward scale."""

    def __init__(self, group_size: int, /, *, n0: int = 4, n_max: int = 16, chunk: int = 2,
                 alpha: float = 0.05, explore: float = 0.0, mu: float = 0.05,
                 lr: float = 0.01):
        super().__init__(group_size, mu, lr)
        if not 2 <= n0 <= n_max:
            raise ValueError(f"allocator 'xrpo': need 2 <= n0 <= n_max, got n0={n0}, "
                             f"n_max={n_max}")
        self.n0, self.n_max, self.chunk = n0, n_max, chunk
        self.alpha, self.explore = alpha, explore
        self.total = 0  # samples consumed so far, for the exploration bonus

    def initial(self, prompt):
        return self.n0

    def more(self, prompt, values, successes, rounds):
        n = len(values)
        if n >= self.n_max:
            return 0
        hits = [1.0] * successes + [0.0] * (n - successes)  # any reward scale: successes
        gain = xrpo_gain(hits, alpha=self.alpha, explore=self.explore, total=self.total)
        return min(self.chunk, self.n_max - n) if gain > self.mu else 0

    def max_size(self):
        return self.n_max

    def end_step(self, outcomes, stats):
        self.total += sum(n for _, n, _ in outcomes)
        super().end_step(outcomes, stats)

    def state(self):
        return {**super().state(), "total": self.total}

    def load_state(self, d):
        super().load_state(d)
        self.total = int(d.get("total", 0))

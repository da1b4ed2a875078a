"""DOT: outlier truncation of response lengths. Among the answers to a prompt that the policy
already solves every time, the unusually long ones are overthinking: each response whose
length lies above the group's outlier threshold (mean + k std of the lengths, or a quantile
of them) loses a fixed reward, so it gets a negative advantage against its equally correct,
shorter siblings. A group with any failure is a hard prompt and keeps its long reasoning.
Where reroll differs: the penalty is a group shaper applied when the group completes (the
config's ``control.dot_k`` / ``control.dot_quantile`` / ``control.dot_penalty``), lengths are
the policy-sampled tokens (``Rollout.n_sampled``), and the penalty is recorded apart from
the verifier scores (``Rollout.shaping``), so the per-prompt statistics never see it.

Owns the rule (`dot_threshold`) and the ``dot`` group shaper.
"""

from __future__ import annotations

import numpy as np

from reroll.control.rules import ranged, reals
from reroll.control.shapers import SHAPERS
from reroll.rollout import Group


@ranged(k="[0, inf)", quantile="[0, 1]")
def dot_threshold(lengths: list[int], *, k: float = 2.0, quantile: float | None = None
                  ) -> float:
    """DOT's outlier threshold of response lengths in an all-correct group: mean + k * std
    (population std, ddof=0), or, when ``quantile`` is set, that quantile with numpy's
    'linear' interpolation (``k`` is then ignored). Lengths strictly above are outliers, so
    a group of equal lengths (or a single response) has none."""
    ls = reals("dot_threshold", "lengths", lengths, 0.0)
    if quantile is not None:
        return float(np.quantile(ls, float(quantile), method="linear"))
    return float(np.mean(ls) + float(k) * np.std(ls))


@SHAPERS.register("dot", ranges={"k": "[0, inf)", "quantile": "[0, 1)",
                                 "penalty": "[0, inf)"})
class DOT:
    """DOT: in a group where every sample succeeded, a sample whose policy-token length lies
    above mean + ``k`` std of the group's lengths (or, with ``quantile`` > 0, that quantile)
    loses ``penalty`` reward; recorded as ``shaping["dot"]`` with ``shaping["dot_threshold"]``."""

    def __init__(self, *, k: float = 2.0, quantile: float = 0.0, penalty: float = 1.0):
        self.k, self.quantile, self.penalty = k, quantile, penalty

    def __call__(self, g: Group, successes: list[bool] | None) -> None:
        if len(g.rollouts) < 2 or successes is None or not all(successes):
            return
        lens = [r.n_sampled for r in g.rollouts]
        thr = dot_threshold(lens, k=self.k, quantile=self.quantile or None)
        for r, n in zip(g.rollouts, lens):
            if n > thr and "dot" not in r.shaping:
                pen = float(self.penalty)
                r.shaping["dot"] = -pen
                r.shaping["dot_threshold"] = float(thr)
                r.reward -= pen

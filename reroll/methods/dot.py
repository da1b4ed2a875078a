"""DOT (Wu et al. 2026, "Anti-Length Shift: Dynamic Outlier Truncation for Training
Efficient Reasoning Models", arXiv 2601.03969): outlier truncation of response lengths.
Rule in one line: in a group whose samples are all correct, a response longer than mean + 3
std of the group's lengths is truncated there, so it loses its answer and its reward.

Among the answers to a prompt that the policy already solves every time, the unusually long
ones are overthinking; truncating them gives them a negative advantage against their equally
correct, shorter siblings. A group with any failure is a hard prompt and keeps its long
reasoning.

"Truncated" in reroll's terms (``rule = "truncate"``, the default): the response is cut
after its first ``floor(threshold)`` policy tokens for the loss (the tokens after the cut
leave the loss mask; the trainer's log-probs of the kept tokens do not depend on later
tokens, so this trains exactly what a response cut there would) and, cut before its answer,
it gets ``cut_reward`` (0: what reroll's verifiers give a response with no answer). Nothing
is dropped from the batch: the cut response is the negative signal. ``rule = "penalty"`` is
reroll's earlier variant: the whole response stays in the loss and loses ``penalty`` reward.

Where reroll differs: the rule is a group shaper applied when the group completes (the
config's ``control.dot_k`` / ``control.dot_quantile`` / ``control.dot_rule``), not inside
generation, so an outlier is generated in full before it is cut; lengths are the
policy-sampled tokens (``Rollout.n_sampled``); a quantile threshold is offered besides
mean + k std; the change is recorded apart from the verifier scores (``Rollout.shaping``:
``"dot"`` the reward change, ``"dot_threshold"``, and ``"dot_cut"`` the tokens kept), so the
per-prompt statistics never see it. The paper's auxiliary KL term and predictive dynamic
sampling are not part of this shaper.

Owns the rule (`dot_threshold`) and the ``dot`` group shaper.
"""

from __future__ import annotations

import math

import numpy as np

from reroll.control.rules import ranged, reals
from reroll.control.shapers import SHAPERS
from reroll.rollout import Group, Rollout


@ranged(k="[0, inf)", quantile="[0, 1]")
def dot_threshold(lengths: list[int], *, k: float = 3.0, quantile: float | None = None
                  ) -> float:
    """DOT's outlier threshold of response lengths in an all-correct group: mean + k * std
    (population std, ddof=0), or, when ``quantile`` is set, that quantile with numpy's
    'linear' interpolation (``k`` is then ignored). Lengths strictly above are outliers, so
    a group of equal lengths (or a single response) has none."""
    ls = reals("dot_threshold", "lengths", lengths, 0.0)
    if quantile is not None:
        return float(np.quantile(ls, float(quantile), method="linear"))
    return float(np.mean(ls) + float(k) * np.std(ls))


def cut(r: Rollout, keep: int) -> None:
    """Take every policy token after the first ``keep`` of ``r``'s response out of the loss
    (its record keeps the tokens)."""
    seen = 0
    for t in range(r.prompt_len, len(r.tokens)):
        if r.loss_mask[t]:
            seen += 1
            r.loss_mask[t] = seen <= keep


@SHAPERS.register("dot", ranges={"k": "[0, inf)", "quantile": "[0, 1)",
                                 "penalty": "[0, inf)", "rule": "{truncate, penalty}",
                                 "cut_reward": "(-inf, inf)"})
class DOT:
    """DOT: in a group where every sample succeeded, a sample whose policy-token length lies
    above mean + ``k`` std of the group's lengths (or, with ``quantile`` > 0, that quantile)
    is cut after ``floor(threshold)`` tokens and gets ``cut_reward`` (``rule="truncate"``),
    or loses ``penalty`` reward (``rule="penalty"``); recorded in ``shaping`` ("dot",
    "dot_threshold", and "dot_cut" when cut). A group is shaped once: one that carries a
    "dot" record already (a restored group completing again) is left as it is."""

    def __init__(self, *, k: float = 3.0, quantile: float = 0.0, penalty: float = 1.0,
                 rule: str = "truncate", cut_reward: float = 0.0):
        if rule not in ("truncate", "penalty"):
            raise ValueError(f"DOT: rule must be \"truncate\" or \"penalty\", got {rule!r}")
        self.k, self.quantile, self.penalty = k, quantile, penalty
        self.rule, self.cut_reward = rule, cut_reward

    def __call__(self, g: Group, successes: list[bool] | None) -> None:
        if len(g.rollouts) < 2 or successes is None or not all(successes):
            return
        if any("dot" in r.shaping for r in g.rollouts):
            return
        lens = [r.n_sampled for r in g.rollouts]
        thr = dot_threshold(lens, k=self.k, quantile=self.quantile or None)
        for r, n in zip(g.rollouts, lens):
            if n <= thr:
                continue
            if self.rule == "penalty":
                delta = -float(self.penalty)
            else:
                keep = math.floor(thr)
                cut(r, keep)
                r.shaping["dot_cut"] = float(keep)
                delta = float(self.cut_reward) - r.reward
            r.shaping["dot"] = delta
            r.shaping["dot_threshold"] = float(thr)
            r.reward = float(self.cut_reward) if self.rule == "truncate" else r.reward + delta

"""XRPO (2025, "XRPO: Pushing the limits of GRPO with Targeted Exploration and
Exploitation"). Rule in one line: samples go to the prompts where one more sample most
shrinks the confidence interval of their mean reward (plus an exploration bonus), hard
prompts with no correct sample get in-context seeding (`reroll.methods.xrpo_seeding`),
and correct answers that the policy found unlikely get sharper (larger) advantages.

Built here:
- the allocator ``xrpo``: one more sample is worth the shrinkage it brings to the Student-t
  half-width of the prompt's mean success, h(n) - h(n+1), plus ``explore *
  sqrt(log(total) / n)``; the interval is over success indicators, whatever the reward scale;
- the advantage estimator ``xrpo`` (novelty-aware sharpening): GRPO's advantage, and a
  sample with a positive advantage whose mean token log-prob lies below its group's mean
  has it multiplied by 1 + ``novelty`` x min(z, ``cap``), z the log-prob's shortfall in
  group standard deviations. Our reading of the paper (its exact form and constants are
  assumptions): sharpening only strengthens correct, novel answers, never flips a sign,
  and uses the behaviour log-probs the engine recorded (the sampler's; the current policy's
  when on-policy).

In-context seeding (prompts with no correct sample get a few solved examples in their
context for some samples) is `reroll.methods.xrpo_seeding` (``control.icl_samples``).

Where reroll differs: XRPO hands a batch's remaining budget out in rounds across prompts;
here each group decides alone against a shadow price ``mu`` (a group cannot see the others'
gains while they are still generating), the price moving so the mean group size meets the
budget. Why that settles at a fixed 8 samples at the defaults (n0 = 4, chunk = 2, budget 8):
the gain depends on the prompt only through its sample std (a factor under 2 between a 1/3
and a 1/2 success rate), while it falls by more than 2x per chunk (h shrinks as
t_{n-1}/sqrt(n)): every prompt's gain at n = 8 (0.020 to 0.036) is below every prompt's gain
at n = 6 (0.041 to 0.068). The price that meets a mean of 8 therefore lies between the two
and stops every group at exactly 8: a threshold cannot rank prompts whose gains do not
overlap across sizes (the exploration bonus, the same for every prompt of one size, does
not change that). The paper's batch-wide ranking does rank them. Here ``chunk = 1`` spreads
the sizes: the gains at n = 7 (0.028 to 0.048) overlap those at n = 8, so how split a group
is decides whether it stops at 7, 8 or 9. The default stays ``chunk = 2`` (the benchmarked
setting), which behaves as fixed n = 8 at a budget of 8.

Owns the rules (`t_halfwidth`, `xrpo_gain`, `novelty_sharpen`), the ``xrpo`` allocator and
the ``xrpo`` advantage estimator.
"""

from __future__ import annotations

import math
from functools import lru_cache

import numpy as np
import torch
from torch import Tensor

from reroll.algo.advantages import ADVANTAGES, grpo
from reroll.algo.groups import check_inputs, dense_ids, group_mean, group_std, singleton
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


@ranged(novelty="[0, inf)", cap="[0, inf)", eps="[0, 1]")
def novelty_sharpen(adv: Tensor, mean_logprobs: Tensor, group_index: Tensor, *,
                    novelty: float, cap: float = 2.0, eps: float = 1e-6) -> Tensor:
    """XRPO's novelty-aware sharpening of advantages ``adv`` [N]: with ``mean_logprobs`` [N]
    each sample's mean token log-prob and z_i = (mean_g l - l_i) / (std_g l + eps) (std
    unbiased; 0 in a singleton group), a sample with A_i > 0 and z_i > 0 gets
    A_i (1 + novelty min(z_i, cap)); every other advantage is unchanged."""
    ids, g = dense_ids(group_index)
    lp = mean_logprobs.to(adv.dtype)
    alone = singleton(ids, g)  # [N]
    z = (group_mean(lp, ids, g) - lp) / (group_std(lp, ids, g) + eps)  # [N]
    z = torch.where(alone, torch.zeros_like(z), z).clamp(0.0, float(cap))
    return torch.where(adv > 0, adv * (1.0 + float(novelty) * z), adv)


@ADVANTAGES.register("xrpo", ranges={"novelty": "[0, inf)", "cap": "[0, inf)",
                                     "eps": "[0, 1]"})
def xrpo_advantage(rewards: Tensor, components: Tensor, group_index: Tensor,
                   mean_logprobs: Tensor | None = None, *, novelty: float = 0.5,
                   cap: float = 2.0, norm_by_std: bool = True, eps: float = 1e-6
                   ) -> tuple[Tensor, Tensor]:
    """XRPO's advantage: GRPO's (``norm_by_std``, ``eps``), then `novelty_sharpen` by the
    samples' mean token log-probs [N] (the trainer hands them to an estimator that asks)."""
    check_inputs(rewards, components, group_index, "advantage 'xrpo'")
    if mean_logprobs is None or mean_logprobs.shape != rewards.shape:
        raise ValueError(f"advantage 'xrpo': needs mean_logprobs [N] (each sample's mean token "
                         f"log-prob), got "
                         f"{None if mean_logprobs is None else tuple(mean_logprobs.shape)}")
    adv, include = grpo(rewards, components, group_index, norm_by_std=norm_by_std, eps=eps)
    return novelty_sharpen(adv, mean_logprobs.to(adv.device), group_index, novelty=novelty,
                           cap=cap, eps=eps), include

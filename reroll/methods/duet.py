"""DUET: two controls of the rollout under one token budget. (1) A marker-gated abort: a
sample that has gone past a horizon without writing its answer marker is pruned, except with
probability q, when it goes on with importance weight 1/q, so the expected weight stays 1
and the gradient unbiased. (2) A pre-rollout allocation: samples per prompt proportional to
its informativeness p (1 - p) (p its posterior success rate) under the token budget.

Owns the rules (`duet_keep`, `duet_informativeness`, `duet_size`, `duet_allocation`), the
marker gate (`MarkerGate`: the policy; the engine only follows the per-request
`reroll.rollout.StopRule` it hands out) and the ``duet`` allocator. Knows nothing of
engines, threads or the event loop.

1. **Marker gate**. Before a sample is generated, ``prepare`` gives it a `StopRule`: stop
   ``grace`` tokens after the answer marker; with a horizon H, a sample that has sampled H
   tokens without a marker is pruned unless its ``keep`` draw says go on. The draw ``u`` is
   a hash of the sample's own sampling seed (a function of the run seed, the group's
   admission number and the sample's index), so the decision depends on nothing else
   running, a repeated run draws the same, and a resumed sample carries it in its record.
   ``keep = u < q`` (`duet_keep`).

   After scoring (``settle``), the sample's weight: 1 for a sample that showed its marker
   by H or ended by then (EOS or its length limit at H); for one that passed H without a
   marker, 1/q when kept and 0 when pruned, so E[weight] = 1 and the policy gradient stays
   unbiased for per-sequence aggregations (with token-mean, the normaliser counts the
   trained tokens, as for any excluded sample). A pruned sample keeps its record
   (``finish = "pruned"``, ``loss_exclusion = "duet_abort"``, weight 0): it stays in its
   group, scored on its truncated text (usually wrong: it had not given its answer), so the
   group's baseline and the per-prompt statistics count it, and the loss leaves it out
   (collation zeroes its tokens). The weight reaches the loss through
   ``Rollout.sample_weight``. ``Rollout.control["duet"]`` records the marker position, the
   horizon, the keep draw, the weight and how the sample ended ("marker_stop", "aborted",
   "eos" or "length").

2. **Token-budget allocation** (`DUETAllocator`, allocator ``duet``). Where reroll differs:
   groups are admitted one at a time, before the rest of their step is known, so the batch
   rule (`duet_allocation`) cannot be applied as such; instead each group decides alone
   against a shadow price ``mu`` on tokens: n = informativeness / (mu x expected length)
   (`duet_size`), the solution of "most information for the tokens" with log returns in
   samples, which with one price for all groups is the batch rule's proportional split.
   Informativeness is p(1 - p) of a Beta posterior of the prompt's recent success rate
   (`duet_informativeness`; 0.25 for an unseen prompt), the expected length the prompt's
   mean policy tokens per sample (the pooled mean for an unseen prompt). ``mu`` moves by
   dual ascent at step boundaries so the mean expected tokens per group meet the budget. A
   step still trains on about rollout.batch_groups x group_size samples (the loop's step is
   counted in samples), so the budget is per group: ``tokens`` (0: group_size x the pooled
   mean length, fixed-n GRPO's spend, redistributed toward informative and short prompts).
"""

from __future__ import annotations

import hashlib
import math
from dataclasses import replace

from reroll.control.allocators import ALLOCATORS, Allocator, Outcome
from reroll.control.rules import allocate, bounds, dual_step, fail, ranged, reals
from reroll.control.stats import PromptRecord, PromptStats
from reroll.rollout import Group, Rollout, StopRule


@ranged(u="[0, 1]", q="(0, 1]")
def duet_keep(u: float, *, q: float) -> tuple[bool, float]:
    """The marker-gated abort for a rollout with no answer marker past the horizon: with
    u ~ U(0, 1) drawn by the caller, continue with importance weight 1/q if u < q
    (probability q), else abort with weight 0: E[weight] = 1, so the estimator stays
    unbiased. u == q aborts."""
    u, q = float(u), float(q)
    return (True, 1.0 / q) if u < q else (False, 0.0)


@ranged(trials="[0, inf)", successes="[0, inf)", prior="(0, inf)")
def duet_informativeness(successes: int, trials: int, *, prior: float = 1.0) -> float:
    """The pre-rollout informativeness of a prompt: p (1 - p) at the mean of its
    Beta(prior + s, prior + n - s) posterior, p = (prior + s) / (2 prior + n), the Bernoulli
    variance that gives a GRPO group non-zero advantages. Unseen (n = 0): 0.25."""
    if successes > trials:
        raise fail("duet_informativeness", "successes", f"<= trials ({trials})", successes)
    a = float(prior)
    p = (a + successes) / (2.0 * a + trials)
    return p * (1.0 - p)


@ranged(score="[0, inf)", rel_len="(0, inf)", mu="[0, inf)", n_min="[0, inf)",
        n_max="[1, inf)")
def duet_size(score: float, rel_len: float, *, mu: float, n_min: int, n_max: int) -> int:
    """Samples for one prompt under a shadow price ``mu`` on tokens: the n that maximises
    ``score * log(n) - mu * n * rel_len`` (diminishing returns in samples, each costing its
    expected length ``rel_len`` in units of the pooled mean length) is
    ``score / (mu * rel_len)``, rounded half up and clipped to [n_min, n_max]; mu = 0 gives
    n_max. With one price for every group the sizes are proportional to score / length, as
    in `duet_allocation`'s batch rule."""
    lo, hi = bounds("duet_size", n_min, n_max)
    score, rel_len, mu = float(score), float(rel_len), float(mu)
    x = score / (mu * rel_len) if mu > 0.0 else math.inf
    return hi if x >= hi else max(lo, math.floor(x + 0.5))


@ranged(token_budget="[0, inf)", mean_len="(0, inf)", n_min="[0, inf)", n_max="[1, inf)")
def duet_allocation(scores: list[float], *, token_budget: int, mean_len: float, n_min: int,
                    n_max: int) -> list[int]:
    """The batch rule: samples per prompt in [n_min, n_max] proportional to the
    informativeness score, with total T = floor(token_budget / mean_len) (the most samples
    whose expected tokens T * mean_len stay within the budget), clipped to [n_min*len,
    n_max*len] (so n_min each even over budget). Water-filling and largest remainder
    (`reroll.control.rules.allocate`); zero-score prompts get n_min unless the rest are at
    n_max."""
    w = reals("duet_allocation", "scores", scores, 0.0)
    lo, hi = bounds("duet_allocation", n_min, n_max)
    m = len(w)
    target = min(max(math.floor(round(token_budget / float(mean_len), 9)), lo * m), hi * m)
    return allocate(w, target, lo, hi)


ABORTED = "duet_abort"  # the loss_exclusion of a pruned sample


def keep_draw(seed: int) -> float:
    """The sample's u ~ U[0, 1) for the keep decision: a hash of its sampling seed alone."""
    digest = hashlib.sha256(f"duet-keep:{int(seed)}".encode()).digest()
    return int.from_bytes(digest[:8], "big") / 2.0**64


def marker_at(tokens: list[int], marker: tuple[int, ...]) -> int:
    """Position (tokens of the response) where ``marker`` first ends, -1 if it never does."""
    m = len(marker)
    for i in range(len(tokens) - m + 1):
        if tuple(tokens[i:i + m]) == marker:
            return i + m
    return -1


class MarkerGate:
    """DUET's marker-gated abort: hands each new sample its `StopRule` (``prepare``) and
    weighs it once scored (``settle``); see the module docstring."""

    def __init__(self, marker: list[int], *, grace: int, horizon: int, q: float):
        if not marker:
            raise ValueError("MarkerGate: the answer marker has no tokens")
        duet_keep(0.0, q=q)  # checks q in (0, 1]
        self.marker, self.grace, self.horizon, self.q = tuple(marker), grace, horizon, q

    def prepare(self, r: Rollout) -> None:
        """Give a fresh sample its rule, with its own keep draw (always kept without a
        horizon). Needs the sample's sampling seed."""
        if r.sampling.seed is None:
            raise ValueError(f"rollout {r.sample_id}: DUET's keep draw needs a sampling seed")
        keep = self.horizon == 0 or duet_keep(keep_draw(r.sampling.seed), q=self.q)[0]
        rule = StopRule(self.marker, grace=self.grace, horizon=self.horizon, keep=keep)
        r.sampling = replace(r.sampling, stop_rule=rule)

    def settle(self, r: Rollout) -> None:
        """Weight and record of a finished sample (once: a settled sample is left as is)."""
        rule = r.sampling.stop_rule
        if rule is None or "duet" in r.control:
            return
        resp = r.response_tokens
        at = marker_at(resp, rule.marker)
        past = rule.horizon > 0 and (r.finish == "pruned" or (
            len(resp) > rule.horizon and not 0 <= at <= rule.horizon))
        weight = (1.0 / self.q if rule.keep else 0.0) if past else 1.0
        if r.finish == "pruned":
            end = "aborted"
            r.loss_exclusion = r.loss_exclusion or ABORTED
        elif (r.finish == "stop" and at >= 0 and len(resp) == at + rule.grace
              and resp[-1] not in r.sampling.stop_token_ids):  # not EOS there by chance
            end = "marker_stop"
        else:
            end = "eos" if r.finish == "stop" else r.finish
        r.sample_weight *= weight
        r.control["duet"] = {"marker_at": at, "horizon": rule.horizon, "grace": rule.grace,
                             "keep": rule.keep, "past_horizon": past, "weight": weight,
                             "end": end}

    @staticmethod
    def metrics(groups: list[Group]) -> dict[str, float]:
        """Per step, over the consumed samples the gate weighed: how many stopped at their
        marker, were aborted, were kept past the horizon; the mean weight."""
        recs = [r.control["duet"] for g in groups for r in g.rollouts if "duet" in r.control]
        if not recs:
            return {}
        return {"control/duet_marker_stops": float(sum(d["end"] == "marker_stop"
                                                       for d in recs)),
                "control/duet_aborted": float(sum(d["end"] == "aborted" for d in recs)),
                "control/duet_kept": float(sum(d["past_horizon"] and d["keep"] for d in recs)),
                "control/duet_weight_mean": sum(d["weight"] for d in recs) / len(recs)}


@ALLOCATORS.register("duet", ranges={"n_min": "[1, inf)", "n_max": "[1, inf)",
                                       "tokens": "[0, inf)", "prior": "(0, inf)",
                                       "recent": "[1, inf)", "mu": "[0, inf)",
                                       "lr": "[0, inf)"})
class DUETAllocator(Allocator):
    """DUET token-budget allocation: n = p(1-p) / (mu x relative expected length), clipped
    to [n_min, n_max], p the mean of the Beta(prior + s, prior + f) posterior over the last
    ``recent`` observations; the price ``mu`` (0: 0.25 / group_size, so an unseen prompt
    starts at group_size) moves by ``lr`` x (mean expected tokens per group - budget) / the
    pooled mean length at each step boundary; budget ``tokens`` per group (0: group_size x
    the pooled mean length). The module docstring says why a price, not a batch split."""

    def __init__(self, group_size: int, /, *, n_min: int = 2, n_max: int = 16,
                 tokens: float = 0.0, prior: float = 1.0, recent: int = 4, mu: float = 0.0,
                 lr: float = 0.002):
        super().__init__(group_size)
        if not 1 <= n_min <= group_size <= n_max:
            raise ValueError(f"allocator 'duet': need n_min <= rollout.group_size <= n_max, "
                             f"got {n_min}, {group_size}, {n_max}")
        self.n_min, self.n_max, self.tokens, self.prior = n_min, n_max, tokens, prior
        self.recent, self.lr = recent, lr
        self.mu = mu if mu > 0 else 0.25 / group_size
        self.pooled_len: float | None = None  # mean policy tokens per sample, at the boundary

    def score(self, prompt: PromptRecord | None) -> float:
        obs = prompt.history[-self.recent:] if prompt is not None else []
        return duet_informativeness(sum(s for _, s, _ in obs), sum(t for _, _, t in obs),
                                    prior=self.prior)

    def rel_len(self, prompt: PromptRecord | None) -> float:
        """Expected length in units of the pooled mean (1 when either is unknown)."""
        own = prompt.mean_len if prompt is not None else None
        if own is None or not self.pooled_len:
            return 1.0
        return max(own, 1.0) / self.pooled_len

    def initial(self, prompt):
        return duet_size(self.score(prompt), self.rel_len(prompt), mu=self.mu,
                         n_min=self.n_min, n_max=self.n_max)

    def max_size(self):
        return self.n_max

    def budget(self) -> float:
        """Tokens per group the price aims at, in units of the pooled mean length."""
        if self.tokens > 0 and self.pooled_len:
            return self.tokens / self.pooled_len
        return float(self.group_size)

    def end_step(self, outcomes: list[Outcome], stats: PromptStats) -> None:
        """Lengths now include this step's samples; then the groups' expected tokens (in
        pooled-mean units) against the budget move the price."""
        self.pooled_len = stats.mean_len()
        if outcomes:
            spent = sum(n * self.rel_len(stats.get(pid)) for pid, n, _ in outcomes)
            self.mu = dual_step(self.mu, spent / len(outcomes), self.budget(), lr=self.lr)
            self.mu = max(self.mu, 1e-9)  # a zero price would give every group n_max forever

    def state(self):
        return {"mu": self.mu, "pooled_len": self.pooled_len}

    def load_state(self, d):
        self.mu = float(d.get("mu", self.mu))
        self.pooled_len = d.get("pooled_len", self.pooled_len)

    def metrics(self):
        out = {"control/price": self.mu, "control/duet_budget": self.budget()}
        if self.pooled_len:
            out["control/duet_pooled_len"] = self.pooled_len
        return out

"""GDRO: distributionally robust rollouts, on two axes (Panaganti et al. 2025, group
distributionally robust optimisation for LLM reasoning RL). Rule in one line: prompts fall
in difficulty bins by their online pass@k; Prompt-GDRO draws bins from multiplicative
weights driven by each bin's failure rate, Rollout-GDRO gives a group samples in proportion
to the Bernoulli std of its bin's success rate under a shadow price.

Rollout-GDRO (allocator ``gdro``): the group size that gives the least variance of the
group means for a mean budget is proportional to the Bernoulli std sqrt(p (1 - p)) of the
prompt's success rate (the Lagrangian solution), with a shadow price ``mu`` on samples.
Prompt-GDRO (selector ``gdro``): prompts fall in difficulty bins; a multiplicative-weights
distribution over the bins, driven by each bin's failure rate, decides which bin the next
prompt comes from, so the policy keeps training where it does worst.

Difficulty (both): a prompt's bin is that of its online pass@k (``bin_by = "pass_at_k"``,
the paper's): of its last ``recent`` observations pooled, c successes in n samples, the
unbiased estimate 1 - C(n - c, k) / C(n, k) (1 - (1 - c/n)^k while n < k), in ``bins``
equal-width bins of [0, 1]. ``bin_by = "mean_rate"`` is reroll's variant: the recent mean
success rate c / n.

Where reroll differs: a group decides its size alone against the price (moved by dual
ascent at step boundaries), and ``p`` is pooled over the prompt's difficulty bin; unseen
prompts sit in the bin of 0.5; the value of ``k`` is our choice (4), the paper's may differ.

Owns the rules (`gdro_sizes`, `mw_update`, `ema`, `pass_at_k`), the ``gdro`` allocator and
the ``gdro`` selector.
"""

from __future__ import annotations

import math
import random

from reroll.control.allocators import ALLOCATORS, ShadowPriced
from reroll.control.rules import allocate, bounds, fail, ranged, reals, round_half_up
from reroll.control.selectors import SELECTORS, Selector
from reroll.control.stats import PromptRecord


@ranged(mean_budget="[0, inf)", n_min="[0, inf)", n_max="[1, inf)")
def gdro_sizes(p: list[float], *, mean_budget: float, n_min: int, n_max: int) -> list[int]:
    """Rollout-GDRO group sizes: n_i in [n_min, n_max] proportional to the Bernoulli std
    s_i = sqrt(p_i (1 - p_i)), with sum n_i == T = round(mean_budget * len(p)) (halves up).
    Water-filling finds c with sum clip(c s_i, n_min, n_max) = T, then largest remainder
    (ties to the lower index) makes the counts integers. An infeasible T clips to n_min*len
    or n_max*len. Prompts with s_i = 0 (p in {0, 1}) get n_min unless the others are all at
    n_max; if every s_i == 0 the budget is spread evenly. Deterministic.
    """
    probs = reals("gdro_sizes", "p", p, 0.0, 1.0)
    lo, hi = bounds("gdro_sizes", n_min, n_max)
    m = len(probs)
    target = min(max(round_half_up(float(mean_budget) * m), lo * m), hi * m)
    return allocate([math.sqrt(q * (1.0 - q)) for q in probs], target, lo, hi)


@ranged(eta="[0, inf)", floor="[0, 1]")
def mw_update(weights: list[float], scores: list[float], *, eta: float,
              floor: float = 0.0) -> list[float]:
    """Prompt-GDRO multiplicative weights over bins: w_b exp(eta score_b), normalised, then
    mixed with uniform: (1 - floor) w + floor / B. Computed in log space shifted by the
    largest log w_b + eta score_b, so large eta*score cannot overflow. A bin with weight 0
    stays at 0 before the mix. ``weights`` need not be normalised."""
    f = "mw_update"
    w = reals(f, "weights", weights, 0.0)
    s = reals(f, "scores", scores)
    if len(s) != len(w):
        raise fail(f, "scores", f"as long as weights ({len(w)})", scores)
    if sum(w) <= 0:
        raise fail(f, "weights", "not all zero", weights)
    eta, floor = float(eta), float(floor)
    logits = [math.log(x) + eta * y if x > 0 else -math.inf for x, y in zip(w, s)]
    top = max(logits)
    e = [math.exp(v - top) for v in logits]
    z = sum(e)
    return [(1.0 - floor) * v / z + floor / len(w) for v in e]


@ranged(successes="[0, inf)", trials="[1, inf)", k="[1, inf)")
def pass_at_k(successes: int, trials: int, *, k: int) -> float:
    """Online pass@k of a prompt with ``successes`` of ``trials`` samples correct: the
    unbiased estimate 1 - C(n - c, k) / C(n, k) when n >= k, else 1 - (1 - c / n)^k (the
    plug-in estimate: too few samples for the unbiased one)."""
    c, n, k = int(successes), int(trials), int(k)
    if c > n:
        raise fail("pass_at_k", "successes", f"<= trials ({n})", c)
    if n >= k:
        return 1.0 - math.comb(n - c, k) / math.comb(n, k)
    return 1.0 - (1.0 - c / n) ** k


def difficulty(rec: PromptRecord | None, *, recent: int, bin_by: str, k: int) -> float | None:
    """The value a prompt is binned by (None before its first observation): its pass@k
    (``bin_by = "pass_at_k"``) or mean success rate (``"mean_rate"``) over its last
    ``recent`` observations pooled."""
    obs = rec.history[-recent:] if rec is not None else []
    n = sum(t for _, _, t in obs)
    if not n:
        return None
    c = sum(s for _, s, _ in obs)
    return pass_at_k(c, n, k=k) if bin_by == "pass_at_k" else c / n


def _check_bin_by(kind: str, bin_by: str) -> None:
    if bin_by not in ("pass_at_k", "mean_rate"):
        raise ValueError(f"{kind} 'gdro': bin_by must be 'pass_at_k' or 'mean_rate', got "
                         f"{bin_by!r}")


@ranged(x="(-inf, inf)", rate="[0, 1]", prev="(-inf, inf)")
def ema(prev: float | None, x: float, *, rate: float) -> float:
    """Exponential moving average (Prompt-GDRO's bin scores):
    x if prev is None else (1 - rate) prev + rate x."""
    x, rate = float(x), float(rate)
    if prev is None:
        return x
    return (1.0 - rate) * float(prev) + rate * x


@ALLOCATORS.register("gdro", ranges={"n_min": "[1, inf)", "n_max": "[1, inf)",
                                       "bins": "[1, inf)", "recent": "[1, inf)",
                                       "mu": "(0, inf)", "lr": "[0, inf)",
                                       "bin_by": "{pass_at_k, mean_rate}", "k": "[1, inf)"})
class RolloutGDRO(ShadowPriced):
    """Rollout-GDRO: a group's size is ``sqrt(p (1 - p)) / mu`` clipped to [n_min, n_max]
    (rounded), with ``p`` the pooled recent success rate of the prompt's difficulty bin
    (``bins`` equal-width bins of its online pass@k, or with ``bin_by = "mean_rate"`` of its
    recent success rate; unseen prompts use the pooled rate of every prompt, 0.5 before
    any). The Lagrangian solution of "least variance of the group
    means for a mean budget": n proportional to the Bernoulli std, the shadow price ``mu``
    making the realised mean ``group_size`` (dual ascent at step boundaries)."""

    def __init__(self, group_size: int, /, *, n_min: int = 2, n_max: int = 16, bins: int = 4,
                 recent: int = 4, mu: float = 0.05, lr: float = 0.002,
                 bin_by: str = "pass_at_k", k: int = 4):
        super().__init__(group_size, mu, lr)
        _check_bin_by("allocator", bin_by)
        self.bin_by, self.k = bin_by, k
        if not 1 <= n_min <= group_size <= n_max:
            raise ValueError(f"allocator 'gdro': need n_min <= rollout.group_size <= n_max, "
                             f"got {n_min}, {group_size}, {n_max}")
        self.n_min, self.n_max, self.bins, self.recent = n_min, n_max, bins, recent
        self.bin_rate: list[float | None] = [None] * bins  # pooled, as of the last boundary
        self.prior = 0.5

    def _bin(self, rate: float) -> int:
        return min(self.bins - 1, int(rate * self.bins))

    def level(self, prompt: PromptRecord | None) -> float | None:
        return difficulty(prompt, recent=self.recent, bin_by=self.bin_by, k=self.k)

    def rate_of(self, prompt: PromptRecord | None) -> float:
        level = self.level(prompt)
        if level is None:
            return self.prior
        pooled = self.bin_rate[self._bin(level)]
        return prompt.recent_rate(self.recent) if pooled is None else pooled

    def initial(self, prompt):
        p = self.rate_of(prompt)
        n = math.sqrt(p * (1.0 - p)) / max(self.mu, 1e-6)
        return int(min(self.n_max, max(self.n_min, round(n))))

    def max_size(self):
        return self.n_max

    def end_step(self, outcomes, stats):
        super().end_step(outcomes, stats)
        succ, trials = [0] * self.bins, [0] * self.bins
        for _, rec in stats.items():
            level = self.level(rec)
            if level is not None:
                for _, s, t in rec.history[-self.recent:]:
                    succ[self._bin(level)] += s
                    trials[self._bin(level)] += t
        self.bin_rate = [s / t if t else None for s, t in zip(succ, trials)]
        pooled = stats.mean_rate()
        self.prior = 0.5 if pooled is None else pooled

    def state(self):
        return {**super().state(), "bin_rate": self.bin_rate, "prior": self.prior}

    def load_state(self, d):
        super().load_state(d)
        self.bin_rate = list(d.get("bin_rate", self.bin_rate))
        self.prior = float(d.get("prior", self.prior))


@SELECTORS.register("gdro", ranges={"bins": "[1, inf)", "eta": "[0, inf)",
                                      "floor": "[0, 1]", "rate": "(0, 1]",
                                      "recent": "[1, inf)",
                                      "bin_by": "{pass_at_k, mean_rate}", "k": "[1, inf)"})
class PromptGDRO(Selector):
    """Prompt-GDRO: prompts fall in ``bins`` difficulty bins by their online pass@k (with
    ``bin_by = "mean_rate"``, reroll's variant, by their recent success rate; unseen prompts
    in the bin of 0.5); a multiplicative-weights distribution over bins,
    ``w_b <- w_b exp(eta score_b)`` normalised and mixed with uniform by ``floor``, where
    ``score_b`` is an EMA (``rate``) of the bin's mean failure rate over the groups it had
    in a step (a mean, so a frequent bin gains nothing for being frequent). A draw picks a
    bin from ``w`` (among bins with prompts), then a prompt of that bin uniformly."""

    def __init__(self, examples, seed, round_size, /, *, bins: int = 4, eta: float = 0.5,
                 floor: float = 0.2, rate: float = 0.3, recent: int = 4,
                 bin_by: str = "pass_at_k", k: int = 4):
        super().__init__(examples, seed, round_size)
        _check_bin_by("selector", bin_by)
        self.bin_by, self.k = bin_by, k
        self.bins, self.eta, self.floor, self.rate, self.recent = bins, eta, floor, rate, recent
        self.weights = [1.0 / bins] * bins
        self.scores: list[float | None] = [None] * bins
        self.bin_of: dict[str, int] = {}  # seen prompts; unseen ones sit in bin_of_rate(0.5)
        self.counts = [0] * bins  # seen prompts per bin

    def bin_of_rate(self, rate: float) -> int:
        return min(self.bins - 1, int(rate * self.bins))

    def _bin(self, prompt_id: str) -> int:
        return self.bin_of.get(prompt_id, self.bin_of_rate(0.5))

    def pick(self, draw, stats):
        rng = random.Random(self.seed * 1_000_003 + draw)
        unseen = len(self.examples) - len(self.bin_of)
        sizes = list(self.counts)
        sizes[self.bin_of_rate(0.5)] += unseen
        w = [wb if n > 0 else 0.0 for wb, n in zip(self.weights, sizes)]
        b = rng.choices(range(self.bins), weights=w)[0] if sum(w) > 0 else None
        for _ in range(64 * math.ceil(len(self.examples) / max(1, sizes[b] if b is not None
                                                                 else 1))):
            ex = self.examples[rng.randrange(len(self.examples))]
            if (b is None or self._bin(ex.prompt_id) == b) and ex.prompt_id not in self.excluded:
                return ex
        return self.examples[rng.randrange(len(self.examples))]  # (practically unreachable)

    def end_step(self, outcomes, stats):
        fail = [[] for _ in range(self.bins)]
        for pid, n, s in outcomes:  # the bin the group was drawn from
            if n:
                fail[self._bin(pid)].append(1.0 - s / n)
        for b, f in enumerate(fail):
            if f:
                self.scores[b] = ema(self.scores[b], sum(f) / len(f), rate=self.rate)
        self.weights = mw_update(self.weights, [s or 0.0 for s in self.scores],
                                 eta=self.eta, floor=self.floor)
        for pid, _, _ in outcomes:  # re-bin the prompts that were just observed
            rate = difficulty(stats.get(pid), recent=self.recent, bin_by=self.bin_by, k=self.k)
            if rate is None:
                continue
            old = self.bin_of.get(pid)
            if old is not None:
                self.counts[old] -= 1
            self.bin_of[pid] = self.bin_of_rate(rate)
            self.counts[self.bin_of[pid]] += 1

    def state(self):
        return {**super().state(), "weights": self.weights, "scores": self.scores,
                "bin_of": self.bin_of}

    def load_state(self, d):
        super().load_state(d)
        self.weights = list(d.get("weights", self.weights))
        self.scores = list(d.get("scores", self.scores))
        self.bin_of = dict(d.get("bin_of", {}))
        self.counts = [0] * self.bins
        for b in self.bin_of.values():
            self.counts[b] += 1

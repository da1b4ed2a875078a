"""Allocators: how many samples each prompt gets (ALGORITHMS.md 3.3, 3.4, 3.6, 3.7, 3.14).

Owns the ``ALLOCATORS`` registry. An allocator is built as ``cls(group_size, *,
hyperparameters)`` (``group_size`` is ``rollout.group_size``, the mean budget N) and answers
three questions:

- ``initial(prompt)``: samples of the first round of a new group;
- ``more(prompt, values, successes, rounds)``: after ``rounds`` rounds, whose members scored
  ``values`` (``successes`` of them counted correct), how many to add now (0 closes the group);
- ``max_size()``: the most a group can reach, which admission reserves for it.

``prompt`` is the prompt's `PromptRecord` (None when unseen), as of the last step boundary.
``end_step(outcomes, stats)`` runs at each step boundary with the consumed groups' ``(prompt,
size, successes)`` in consumption order: the only place cross-prompt state (a shadow price)
changes, so a resumed run decides exactly what an uninterrupted one did. ``state`` /
``load_state`` carry that state through checkpoints. The decision math is in `rules`; this
module knows nothing of engines, workflows or the scheduler.
"""

from __future__ import annotations

import math

from reroll.control import rules
from reroll.control.stats import PromptRecord, PromptStats
from reroll.registry import Registry

ALLOCATORS = Registry("allocator")
Outcome = tuple[str, int, int]  # (prompt_id, samples, successes) of one consumed group


class Allocator:
    """Fixed n: every group gets ``group_size`` samples in one round (plain GRPO)."""

    def __init__(self, group_size: int, /):
        if group_size < 1:
            raise ValueError(f"allocator: group_size must be >= 1, got {group_size}")
        self.group_size = group_size

    def initial(self, prompt: PromptRecord | None) -> int:
        return self.group_size

    def more(self, prompt: PromptRecord | None, values: list[float], successes: int,
             rounds: int) -> int:
        return 0

    def max_size(self) -> int:
        return self.group_size

    def end_step(self, outcomes: list[Outcome], stats: PromptStats) -> None:
        pass

    def state(self) -> dict:
        return {}

    def load_state(self, d: dict) -> None:
        pass

    def metrics(self) -> dict[str, float]:
        """What to log about the allocator's own state."""
        return {}


ALLOCATORS.register("fixed")(Allocator)


@ALLOCATORS.register("ar3po", ranges={"k": "[1, inf)", "max_stages": "[1, inf)"})
class AR3PO(Allocator):
    """AR3PO staged sampling: ``k`` samples per stage; another stage only while the group has
    no correct sample, at most ``max_stages`` stages. Easy prompts stop after one stage."""

    def __init__(self, group_size: int, /, *, k: int = 2, max_stages: int = 4):
        super().__init__(group_size)
        if k < 1 or max_stages < 1:
            raise ValueError(f"allocator 'ar3po': k and max_stages must be >= 1, got "
                             f"{k}, {max_stages}")
        self.k, self.max_stages = k, max_stages

    def initial(self, prompt):
        return self.k

    def more(self, prompt, values, successes, rounds):
        return rules.ar3po_more(successes, len(values), rounds - 1, k=self.k,
                                max_stages=self.max_stages)

    def max_size(self):
        return self.k * self.max_stages


@ALLOCATORS.register("dars", ranges={"n_max": "[1, inf)"})
class DARS(Allocator):
    """DARS: ``group_size`` samples, then one more round for prompts with accuracy below
    0.5, sized by the equal-treatment ("et") or hardness-weighted ("hw") schedule, up to
    ``n_max`` samples in all. ``std_norm`` picks the schedule for std-normalised advantages."""

    def __init__(self, group_size: int, /, *, n_max: int = 32, schedule: str = "et",
                 std_norm: bool = True):
        super().__init__(group_size)
        if schedule not in ("et", "hw"):
            raise ValueError(f"allocator 'dars': schedule must be 'et' or 'hw', got "
                             f"{schedule!r}")
        if n_max < group_size:
            raise ValueError(f"allocator 'dars': n_max ({n_max}) must be >= rollout."
                             f"group_size ({group_size})")
        self.n_max, self.schedule, self.std_norm = n_max, schedule, std_norm

    def more(self, prompt, values, successes, rounds):
        if rounds > 1:
            return 0
        n = len(values)
        return rules.dars_extra(successes / n, n, n_max=self.n_max, schedule=self.schedule,
                                std_norm=self.std_norm)

    def max_size(self):
        return self.n_max


class _ShadowPriced(Allocator):
    """An allocator that meets a mean budget of ``group_size`` samples per group on average
    through a shadow price ``mu`` on samples, moved by projected dual ascent at each step
    boundary from the realised mean group size (`rules.dual_step`)."""

    def __init__(self, group_size: int, mu: float, lr: float):
        super().__init__(group_size)
        self.mu, self.lr = mu, lr

    def end_step(self, outcomes, stats):
        if outcomes:
            mean = sum(n for _, n, _ in outcomes) / len(outcomes)
            self.mu = rules.dual_step(self.mu, mean, self.group_size, lr=self.lr)

    def state(self):
        return {"mu": self.mu}

    def metrics(self):
        return {"control/price": self.mu}

    def load_state(self, d):
        self.mu = float(d.get("mu", self.mu))


@ALLOCATORS.register("xrpo", ranges={"n0": "[2, inf)", "n_max": "[2, inf)",
                                       "chunk": "[1, inf)", "alpha": "(0, 1)",
                                       "explore": "[0, inf)", "mu": "[0, inf)",
                                       "lr": "[0, inf)"})
class XRPO(_ShadowPriced):
    """XRPO-style allocation: ``n0`` samples first; then ``chunk`` more at a time while one
    more sample still shrinks the prompt's Student-t confidence half-width (plus an
    exploration bonus for rarely sampled prompts) by more than the shadow price ``mu``, up to
    ``n_max``. ``mu`` follows the budget (mean ``group_size`` samples per group). The
    interval is over success indicators (``control.success_at``), whatever the reward scale.

    XRPO hands the remaining budget of a batch out in rounds across prompts; here each group
    decides alone against the price, the price being what makes the decisions meet the budget
    (a group cannot see the others' gains while they are still generating)."""

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
        gain = rules.xrpo_gain(hits, alpha=self.alpha, explore=self.explore,
                               total=self.total)
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


@ALLOCATORS.register("gdro", ranges={"n_min": "[1, inf)", "n_max": "[1, inf)",
                                       "bins": "[1, inf)", "recent": "[1, inf)",
                                       "mu": "(0, inf)", "lr": "[0, inf)"})
class RolloutGDRO(_ShadowPriced):
    """Rollout-GDRO: a group's size is ``sqrt(p (1 - p)) / mu`` clipped to [n_min, n_max]
    (rounded), with ``p`` the pooled recent success rate of the prompt's difficulty bin
    (``bins`` equal-width bins of its own recent rate; unseen prompts use the pooled rate of
    every prompt, 0.5 before any). The Lagrangian solution of "least variance of the group
    means for a mean budget": n proportional to the Bernoulli std, the shadow price ``mu``
    making the realised mean ``group_size`` (dual ascent at step boundaries)."""

    def __init__(self, group_size: int, /, *, n_min: int = 2, n_max: int = 16, bins: int = 4,
                 recent: int = 4, mu: float = 0.05, lr: float = 0.002):
        super().__init__(group_size, mu, lr)
        if not 1 <= n_min <= group_size <= n_max:
            raise ValueError(f"allocator 'gdro': need n_min <= rollout.group_size <= n_max, "
                             f"got {n_min}, {group_size}, {n_max}")
        self.n_min, self.n_max, self.bins, self.recent = n_min, n_max, bins, recent
        self.bin_rate: list[float | None] = [None] * bins  # pooled, as of the last boundary
        self.prior = 0.5

    def _bin(self, rate: float) -> int:
        return min(self.bins - 1, int(rate * self.bins))

    def rate_of(self, prompt: PromptRecord | None) -> float:
        own = prompt.recent_rate(self.recent) if prompt is not None else None
        if own is None:
            return self.prior
        pooled = self.bin_rate[self._bin(own)]
        return own if pooled is None else pooled

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
            rate = rec.recent_rate(self.recent)
            if rate is not None:
                for _, s, t in rec.history[-self.recent:]:
                    succ[self._bin(rate)] += s
                    trials[self._bin(rate)] += t
        self.bin_rate = [s / t if t else None for s, t in zip(succ, trials)]
        pooled = stats.mean_rate()
        self.prior = 0.5 if pooled is None else pooled

    def state(self):
        return {**super().state(), "bin_rate": self.bin_rate, "prior": self.prior}

    def load_state(self, d):
        super().load_state(d)
        self.bin_rate = list(d.get("bin_rate", self.bin_rate))
        self.prior = float(d.get("prior", self.prior))


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
    the pooled mean length). `reroll.control.duet` says why a price, not a batch split."""

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
        return rules.duet_informativeness(sum(s for _, s, _ in obs), sum(t for _, _, t in obs),
                                          prior=self.prior)

    def rel_len(self, prompt: PromptRecord | None) -> float:
        """Expected length in units of the pooled mean (1 when either is unknown)."""
        own = prompt.mean_len if prompt is not None else None
        if own is None or not self.pooled_len:
            return 1.0
        return max(own, 1.0) / self.pooled_len

    def initial(self, prompt):
        return rules.duet_size(self.score(prompt), self.rel_len(prompt), mu=self.mu,
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
            self.mu = rules.dual_step(self.mu, spent / len(outcomes), self.budget(),
                                      lr=self.lr)
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

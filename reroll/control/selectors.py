"""Prompt selectors: which prompt a new group gets (ALGORITHMS.md 3.5 VADE, 3.9 DOTS, 3.14
Prompt-GDRO). Uniform selection is `PromptStream`'s own epoch-wise shuffle (``uniform``).

Owns the ``SELECTORS`` registry. A selector is built as ``cls(examples, seed, round_size,
*, hyperparameters)`` and answers ``pick(draw, stats) -> Example`` for the ``draw``-th fresh
prompt of the run, reading the per-prompt statistics as of the last step boundary. Every
random choice is seeded by (run seed, draw or round), so a resumed run picks what an
uninterrupted one picked; what a selector caches between draws is in ``state``. Round-based
selectors (DOTS, VADE) choose ``round_size`` distinct prompts at once from a candidate pool.
Knows nothing of engines or the scheduler; the scoring math is in `rules`.
"""

from __future__ import annotations

import math
import random

import numpy as np

from reroll.control import embedding, rules
from reroll.control.stats import PromptRecord, PromptStats
from reroll.registry import Registry
from reroll.rollout import Example

SELECTORS = Registry("selector")


class Selector:
    def __init__(self, examples: list[Example], seed: int, round_size: int, /):
        if not examples:
            raise ValueError("selector: the task's train split is empty")
        self.examples, self.seed, self.round_size = examples, seed, max(1, round_size)
        self.excluded: set[str] = set()  # prompts given up on (never picked again)

    def pick(self, draw: int, stats: PromptStats) -> Example:
        raise NotImplementedError

    def end_step(self, outcomes: list[tuple[str, int, int]], stats: PromptStats) -> None:
        pass

    def exclude(self, prompt_id: str) -> None:
        self.excluded.add(prompt_id)

    def state(self) -> dict:
        return {"excluded": sorted(self.excluded)}

    def load_state(self, d: dict) -> None:
        self.excluded = set(d.get("excluded", []))


class _Rounds(Selector):
    """Picks ``round_size`` distinct prompts per round, the best by a seeded random key
    (Gumbel-top-k over log-weights, i.e. sampling without replacement in proportion to the
    weights), among ``pool`` candidates drawn uniformly (0: every prompt)."""

    def __init__(self, examples, seed, round_size, pool: int):
        super().__init__(examples, seed, round_size)
        self.pool = pool
        self.round, self.picks = -1, []

    def keys(self, cands: list[Example], stats: PromptStats, rng: np.random.Generator
             ) -> np.ndarray:
        raise NotImplementedError

    def pick(self, draw, stats):
        r, pos = divmod(draw, self.round_size)
        if r != self.round:
            rng = np.random.default_rng([self.seed, r, 7])
            n = len(self.examples)
            idx = (rng.choice(n, size=self.pool, replace=False) if 0 < self.pool < n
                   else np.arange(n))
            cands = [self.examples[i] for i in idx]
            keys = self.keys(cands, stats, rng)
            keys[[e.prompt_id in self.excluded for e in cands]] = -np.inf
            order = np.argsort(-keys, kind="stable")[: self.round_size]
            picks = [int(idx[i]) for i in order]
            while len(picks) < self.round_size:  # fewer candidates than a round: repeat
                picks += picks[: self.round_size - len(picks)]
            self.round, self.picks = r, picks
        return self.examples[self.picks[pos]]

    def state(self):
        return {**super().state(), "round": self.round, "picks": list(self.picks)}

    def load_state(self, d):
        super().load_state(d)
        self.round, self.picks = int(d.get("round", -1)), list(d.get("picks", []))


def gumbel(rng: np.random.Generator, n: int) -> np.ndarray:
    return -np.log(-np.log(rng.uniform(1e-12, 1.0, size=n)))


@SELECTORS.register("dots", ranges={"alpha": "[0, 1]", "tau": "(0, inf)", "recent": "[1, inf)",
                                      "unseen": "[0, 1]", "pool": "[0, inf)",
                                      "ref_size": "[1, inf)", "temperature": "(0, inf)",
                                      "dim": "[1, inf)", "predict": "{rate, attention}"})
class DOTS(_Rounds):
    """DOTS: prompts whose predicted success rate is near ``alpha``, sampled without
    replacement with probability proportional to ``exp(-|p - alpha| / tau)``. A prompt with
    observations is predicted by its own success rate over its last ``recent`` of them. An
    unseen one: with ``predict = "attention"`` (DOTS's rule, `reroll.control.embedding`), by
    attention over the ``ref_size`` most recently observed prompts (the reference set), with
    weights ``softmax(cos(e_q, e_r) / temperature)`` over hashed n-gram embeddings of ``dim``
    buckets; with ``predict = "rate"``, or before anything was observed, as ``unseen``."""

    def __init__(self, examples, seed, round_size, /, *, alpha: float = 0.5, tau: float = 1e-3,
                 recent: int = 4, unseen: float = 0.5, pool: int = 2048,
                 predict: str = "rate", ref_size: int = 256, temperature: float = 0.05,
                 dim: int = 256):
        super().__init__(examples, seed, round_size, pool)
        if predict not in ("rate", "attention"):
            raise ValueError(f"selector 'dots': predict must be \"rate\" or \"attention\", "
                             f"got {predict!r}")
        self.alpha, self.tau, self.recent, self.unseen = alpha, tau, recent, unseen
        self.predict, self.ref_size, self.temperature, self.dim = (predict, ref_size,
                                                                   temperature, dim)
        self._emb: dict[str, np.ndarray] = {}  # prompt id -> embedding (derived, not state)
        self.by_text = {e.prompt_id: e.prompt for e in examples}

    def embed(self, prompt_id: str) -> np.ndarray:
        if prompt_id not in self._emb:
            self._emb[prompt_id] = embedding.hashed_ngrams(self.by_text.get(prompt_id, ""),
                                                           dim=self.dim)
        return self._emb[prompt_id]

    def predicted(self, rec: PromptRecord | None) -> float:
        rate = rec.recent_rate(self.recent) if rec is not None else None
        return self.unseen if rate is None else rate

    def reference(self, stats: PromptStats) -> list[tuple[str, float]]:
        """The ``ref_size`` most recently observed prompts and their recent rates (ties by
        prompt id, so the set does not depend on insertion order)."""
        seen = [(r.last_step, pid, r.recent_rate(self.recent)) for pid, r in stats.items()
                if pid in self.by_text]
        seen = sorted((x for x in seen if x[2] is not None), key=lambda x: (-x[0], x[1]))
        return [(pid, rate) for _, pid, rate in seen[: self.ref_size]]

    def predictions(self, cands: list[Example], stats: PromptStats) -> np.ndarray:
        p = np.array([self.predicted(stats.get(e.prompt_id)) for e in cands])
        if self.predict == "attention":
            recs = [stats.get(e.prompt_id) for e in cands]
            unseen = [i for i, r in enumerate(recs)
                      if r is None or r.recent_rate(self.recent) is None]
            ref = self.reference(stats) if unseen else []
            if ref:
                q = np.stack([self.embed(cands[i].prompt_id) for i in unseen])
                k = np.stack([self.embed(pid) for pid, _ in ref])
                p[unseen] = embedding.attention_predict(
                    q, k, np.array([r for _, r in ref]), temperature=self.temperature)
        return p

    def keys(self, cands, stats, rng):
        p = self.predictions(cands, stats)
        return -np.abs(p - self.alpha) / self.tau + gumbel(rng, len(cands))


@SELECTORS.register("vade", ranges={"decay": "(0, 1]", "pool": "[0, inf)"})
class VADE(_Rounds):
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
            a, b = rules.beta_update(a, b, succ, n - succ, decay=d)
            at = s
        if at is not None and step > at:
            a, b = rules.beta_update(a, b, 0, 0, decay=self.decay ** (step - at))
        return a, b

    def keys(self, cands, stats, rng):
        step = max((r.last_step for _, r in stats.items()), default=0) + 1
        ab = np.array([self.posterior(stats.get(e.prompt_id), step) for e in cands])
        p = rng.beta(ab[:, 0], ab[:, 1])
        return p * (1.0 - p) + 1e-9 * rng.uniform(size=len(cands))  # ties broken at random


@SELECTORS.register("gdro", ranges={"bins": "[1, inf)", "eta": "[0, inf)",
                                      "floor": "[0, 1]", "rate": "(0, 1]",
                                      "recent": "[1, inf)"})
class PromptGDRO(Selector):
    """Prompt-GDRO: prompts fall in ``bins`` difficulty bins by their recent success rate
    (unseen prompts in the bin of rate 0.5); a multiplicative-weights distribution over bins,
    ``w_b <- w_b exp(eta score_b)`` normalised and mixed with uniform by ``floor``, where
    ``score_b`` is an EMA (``rate``) of the bin's mean failure rate over the groups it had
    in a step (a mean, so a frequent bin gains nothing for being frequent). A draw picks a
    bin from ``w`` (among bins with prompts), then a prompt of that bin uniformly."""

    def __init__(self, examples, seed, round_size, /, *, bins: int = 4, eta: float = 0.5,
                 floor: float = 0.2, rate: float = 0.3, recent: int = 4):
        super().__init__(examples, seed, round_size)
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
                self.scores[b] = rules.ema(self.scores[b], sum(f) / len(f), rate=self.rate)
        self.weights = rules.mw_update(self.weights, [s or 0.0 for s in self.scores],
                                       eta=self.eta, floor=self.floor)
        for pid, _, _ in outcomes:  # re-bin the prompts that were just observed
            rec = stats.get(pid)
            rate = rec.recent_rate(self.recent) if rec is not None else None
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

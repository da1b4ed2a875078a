"""DOTS: online difficulty targeting. Prompts whose predicted success rate is near a target
``alpha`` (0.5: where a GRPO group most often has reward variance) are chosen, sampled
without replacement with probability softmax(-|p_hat - alpha| / tau). An unseen prompt's
rate is predicted by attention over recently observed prompts (similar prompts, similar
difficulty). Where reroll differs: prompts are chosen in rounds from a seeded candidate pool
(Gumbel-top-k), the embeddings are hashed n-grams (`reroll.control.embedding`), and
``predict = "rate"`` skips the attention.

Owns the rule (`dots_weights`) and the ``dots`` selector.
"""

from __future__ import annotations

import math

import numpy as np

from reroll.control import embedding
from reroll.control.rules import ranged, reals
from reroll.control.selectors import SELECTORS, Rounds, gumbel
from reroll.control.stats import PromptRecord, PromptStats
from reroll.rollout import Example


@ranged(alpha="[0, 1]", tau="(0, inf)")
def dots_weights(p_hat: list[float], *, alpha: float = 0.5, tau: float = 1e-3) -> list[float]:
    """Selection probabilities: softmax of -|p_hat_i - alpha| / tau, computed stably (the
    largest exponent is subtracted first, so tau = 1e-4 does not turn into 0/0). ``p_hat``
    are predicted success rates; only finiteness is checked, so a calibrated prediction
    slightly outside [0, 1] is accepted."""
    ps = reals("dots_weights", "p_hat", p_hat)
    alpha, tau = float(alpha), float(tau)
    z = [-abs(p - alpha) / tau for p in ps]
    top = max(z)
    e = [math.exp(v - top) for v in z]
    total = sum(e)
    return [v / total for v in e]


@SELECTORS.register("dots", ranges={"alpha": "[0, 1]", "tau": "(0, inf)", "recent": "[1, inf)",
                                      "unseen": "[0, 1]", "pool": "[0, inf)",
                                      "ref_size": "[1, inf)", "temperature": "(0, inf)",
                                      "dim": "[1, inf)", "predict": "{rate, attention}"})
class DOTS(Rounds):
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

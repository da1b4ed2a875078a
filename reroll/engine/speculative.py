"""Draft verification: which tokens of a `Draft` the current policy accepts, from one forward
pass over prompt + draft (SPEC-RL's lenient rule: a draft token is kept with probability
``min(1, lenience * p / q)``; exact rejection sampling at lenience 1), and what the token at
the first rejected position is drawn from. Pure tensor functions.

Owns the acceptance rule, its random numbers and the resampling rules (`RESAMPLE`). Knows
nothing of caches, slots or where a draft came from (the drafters live in
`reroll.methods.specrl`, `reroll.methods.das`); the engine feeds the logits and samples the
token after the accepted prefix itself, with `sampling.sample`'s ``ban`` for
`resample_ban`'s token.

For draft tokens ``x_0 .. x_{D-1}`` at sequence positions ``pos0 .. pos0 + D - 1``:

* ``p(x_t)``: the request's sampling distribution (temperature, top-k, top-p, as
  `sampling.scaled_logits`) at the logits row that predicts position ``pos0 + t``;
* ``a_t = min(1, lenience * p(x_t) / q(x_t))``, ``q(x_t)`` the draft's recorded probability
  (1 for a deterministic draft); greedy requests accept exactly the argmax tokens;
* ``u_t``: a counter-based uniform of (request key, position), from a stream apart from the
  one the sampler uses at the same position, so acceptance and the next draw are
  independent;
* ``n``: the first ``t`` with ``u_t >= a_t`` (``D`` when none): ``x_0 .. x_{n-1}`` are kept.

The token at position ``pos0 + n`` (when ``n < D``) is drawn by the draft's ``resample``:

* ``"full"``: from the whole of ``p`` (SPEC-RL's rule: its reference cuts the draft at the
  first rejection and lets the rollout engine generate on, which samples that position from
  the current policy). Not exact: with a deterministic draft the drafted token comes out
  with probability ``p(x) + (1 - p(x)) p(x)``, more than ``p(x)`` unless ``p(x)`` is 0 or 1.
* ``"residual"``: from ``p`` without the drafted token, renormalised. This is the standard
  speculative-sampling residual ``max(0, p - q)`` renormalised when ``q`` is a point mass at
  ``x`` (a deterministic draft: ``p(x) - 1 <= 0``, every other ``p(v) - 0 = p(v)``), so with
  lenience 1 and no recorded ``q`` it is exact: token ``v`` comes out with probability
  ``p(x) [v = x] + (1 - p(x)) p(v) / (1 - p(x)) [v != x] = p(v)``, for any ``x``. With a
  sampled draft (recorded ``q``) the exact residual needs all of ``q``, which the request
  does not know; removing ``x`` alone is then an approximation, as is lenience > 1.
"""

from __future__ import annotations

import math

import torch
from torch import Tensor

from reroll.engine.sampling import _signed, scaled_logits, uniforms

_ACCEPT_SALT = _signed(0x6A09E667F3BCC908)  # keys the acceptance stream apart from sampling

RESAMPLE = ("full", "residual")  # the rules for the first rejected position (module docstring)


def resample_ban(tokens: tuple[int, ...], n: int, rule: str) -> int:
    """The token the draw at the first rejected position ``n`` leaves out (`sampling.sample`'s
    ``ban``): the rejected draft token under ``"residual"``, none (-1) under ``"full"`` or
    when the whole draft was kept."""
    if rule not in RESAMPLE:
        raise ValueError(f"resample must be one of {RESAMPLE}, got {rule!r}")
    return tokens[n] if rule == "residual" and n < len(tokens) else -1


def acceptance(logp: Tensor, q_logp: Tensor | None, lenience: float) -> Tensor:
    """``min(1, lenience * p / q)`` per draft token: [D], [D] | None -> [D] float32
    (``q_logp`` None: a deterministic draft, q = 1)."""
    ratio = logp if q_logp is None else logp - q_logp
    return torch.exp(ratio + math.log(lenience)).clamp(max=1.0)


def first_rejection(a: Tensor, u: Tensor) -> int:
    """Tokens kept: the first ``t`` with ``u[t] >= a[t]``, or ``len(a)`` when all pass."""
    rejected = (u >= a).nonzero()
    return int(rejected[0, 0]) if rejected.numel() else int(a.shape[0])


def accept_uniforms(key: int, pos0: int, n: int) -> Tensor:
    """[n] uniforms of the acceptance stream at positions ``pos0 .. pos0 + n - 1``."""
    keys = torch.full((n,), key ^ _ACCEPT_SALT, dtype=torch.long)
    return uniforms(keys, torch.arange(pos0, pos0 + n, dtype=torch.long))


def verify(
    logits: Tensor,  # [D, V] row t predicts the draft token at position pos0 + t
    tokens: tuple[int, ...],  # the D draft tokens
    q_logprobs: tuple[float, ...],  # their recorded log-probs, or () for a deterministic draft
    lenience: float,
    *,
    temperature: float,
    top_k: int,
    top_p: float,
    key: int,  # the request's seed key (sampling.seed_key)
    pos0: int,
) -> tuple[int, list[float]]:
    """(tokens kept ``n``, the current policy's log-probs of the kept tokens ``[n]``); the
    log-probs are under the distribution the request samples from (greedy: temperature 1)."""
    d = len(tokens)
    rows = logits[:d].float().cpu()
    draft = torch.tensor(tokens, dtype=torch.long)
    greedy = temperature == 0.0
    scaled = scaled_logits(rows, torch.full((d,), float(temperature)),
                           torch.full((d,), int(top_k), dtype=torch.long),
                           torch.full((d,), float(top_p)), any_greedy=greedy,
                           any_filter=not greedy and (top_k > 0 or top_p < 1.0))
    logp = torch.log_softmax(scaled, dim=-1).gather(-1, draft.unsqueeze(-1)).squeeze(-1)  # [D]
    if greedy:
        a = (rows.argmax(dim=-1) == draft).float()
    else:
        q = torch.tensor(q_logprobs, dtype=torch.float32) if q_logprobs else None
        a = acceptance(logp, q, lenience)
    n = first_rejection(a, accept_uniforms(key, pos0, d))
    return n, logp[:n].tolist()

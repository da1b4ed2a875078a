"""Token sampling for a batch of requests with per-row parameters: pure tensor functions.

Owns: turning next-token logits into (token, behaviour log-prob) pairs under each row's
temperature / top-k / top-p, and the per-request random numbers. Knows nothing of caches,
schedulers or records.

Which distribution the recorded log-prob is under (the trainer must compare against it):

* sampled rows (temperature > 0): ``log softmax(filter(logits / temperature))`` at the sampled
  token, where ``filter`` keeps the ``top_k`` largest logits, then the smallest set of those
  whose renormalised probabilities reach ``top_p`` (the token that crosses the threshold is
  kept) and sets the rest to -inf. With ``top_k = 0`` and ``top_p = 1`` nothing is filtered,
  so the record equals the trainer's ``log_softmax(logits / temperature)`` over the full
  vocabulary, up to floating-point noise. With filters on, the record is the log-prob of the
  renormalised, truncated distribution (>= the full-vocabulary value), which is what an
  importance weight ``pi / mu`` must divide by.
* greedy rows (temperature == 0): the token is ``argmax(logits)`` and the record is
  ``log_softmax(logits)`` at it, i.e. the temperature-1 full-vocabulary log-prob (greedy has
  no sampling distribution of its own; this is the value a temperature-1 trainer recomputes).

Randomness: every row's uniform number is a counter-based hash of (request seed, position of
the token in its sequence). A seeded request therefore samples the same tokens whatever else
shares its batch, whichever slot it lands in, and even across an abort/resume (same weights),
and the whole batch draws its numbers in a handful of vectorised integer ops instead of one
``torch.Generator`` call per row per step.
"""

from __future__ import annotations

import torch
from torch import Tensor

_MASK64 = (1 << 64) - 1


def _signed(x: int) -> int:
    """A 64-bit unsigned constant as the int64 value with the same bits."""
    x &= _MASK64
    return x - (1 << 64) if x >= 1 << 63 else x


_GOLDEN = _signed(0x9E3779B97F4A7C15)
_MIX1 = _signed(0xBF58476D1CE4E5B9)
_MIX2 = _signed(0x94D049BB133111EB)


def _shr(x: Tensor, k: int) -> Tensor:
    """Logical right shift of int64 bit patterns (torch's >> is arithmetic)."""
    return (x >> k) & ((1 << (64 - k)) - 1)


def splitmix64(x: Tensor) -> Tensor:
    """The splitmix64 finaliser on int64 tensors (wrapping arithmetic): a bijective hash."""
    z = x + _GOLDEN
    z = (z ^ _shr(z, 30)) * _MIX1
    z = (z ^ _shr(z, 27)) * _MIX2
    return z ^ _shr(z, 31)


def uniforms(keys: Tensor, positions: Tensor) -> Tensor:
    """One float32 in [0, 1) per row from (request key, token position): [B], [B] -> [B].

    ``keys`` come from `seed_key`. 24 random bits, so every value is exact in float32 and
    strictly below 1."""
    h = splitmix64(keys ^ positions)
    return _shr(h, 40).to(torch.float32) * (1.0 / (1 << 24))


def seed_key(seed: int) -> int:
    """A request's int64 key: splitmix64 of its seed (hashed once, when the request is added)."""
    z = (seed + 0x9E3779B97F4A7C15) & _MASK64
    z = ((z ^ (z >> 30)) * 0xBF58476D1CE4E5B9) & _MASK64
    z = ((z ^ (z >> 27)) * 0x94D049BB133111EB) & _MASK64
    return _signed(z ^ (z >> 31))


def sample(
    logits: Tensor,  # [B, V] next-token logits (any float dtype)
    temperature: Tensor,  # [B] float; 0 = greedy
    top_k: Tensor,  # [B] int64; 0 = off
    top_p: Tensor,  # [B] float in (0, 1]; 1 = off
    u: Tensor,  # [B] float32 uniforms in [0, 1)
    *,
    any_greedy: bool = True,
    any_filter: bool = True,
    ban: Tensor | None = None,  # [B] int64: a token to leave out of the draw; -1 = none
) -> tuple[Tensor, Tensor]:
    """(tokens [B] int64, behaviour log-probs [B] float32); see the module docstring for the
    distribution. ``any_greedy`` / ``any_filter`` are hints that let a batch with no greedy
    row, or no top-k/top-p row, skip that work; passing True is always correct.

    ``ban`` draws row ``b`` from its distribution with token ``ban[b]`` removed and
    renormalised (the residual after a rejected draft token, `reroll.engine.speculative`);
    the recorded log-prob stays the one under the whole distribution. A banned token whose
    probability is already 0 changes nothing, bit for bit."""
    scaled = scaled_logits(logits, temperature, top_k, top_p, any_greedy=any_greedy,
                           any_filter=any_filter)
    logp = torch.log_softmax(scaled, dim=-1)  # [B, V], the distribution sampled from
    draw = logp
    if ban is not None:
        hit = torch.zeros_like(scaled, dtype=torch.bool).scatter_(
            -1, ban.clamp(min=0).unsqueeze(-1), (ban >= 0).unsqueeze(-1))
        draw = torch.log_softmax(scaled.masked_fill(hit, float("-inf")), dim=-1)
    # inverse CDF in vocabulary order, so a row's token never depends on its batch-mates
    cdf = draw.exp().cumsum(dim=-1)
    idx = torch.searchsorted(cdf, (u * cdf[:, -1]).unsqueeze(-1), right=True)  # [B, 1]
    idx = idx.clamp_(max=logits.shape[-1] - 1)
    if any_filter or ban is not None:  # rounding at the top of the CDF: never a removed token
        idx = torch.where(draw.gather(-1, idx).isneginf(), draw.argmax(-1, keepdim=True), idx)
    idx = idx.squeeze(-1)
    if any_greedy:
        idx = torch.where(temperature == 0, logits.argmax(dim=-1), idx)
    return idx, logp.gather(-1, idx.unsqueeze(-1)).squeeze(-1)


def scaled_logits(
    logits: Tensor,  # [B, V]
    temperature: Tensor,  # [B]
    top_k: Tensor,  # [B]
    top_p: Tensor,  # [B]
    *,
    any_greedy: bool = True,
    any_filter: bool = True,
) -> Tensor:
    """[B, V] float32 ``filter(logits / temperature)`` (filtered tokens -inf): its log_softmax
    is the distribution a row samples from (greedy rows: temperature 1, unfiltered)."""
    logits = logits.float()
    greedy = temperature == 0 if any_greedy else None
    if any_greedy:
        temperature = torch.where(greedy, torch.ones_like(temperature), temperature)
    scaled = logits / temperature.unsqueeze(-1)
    if any_filter:
        scaled = scaled.masked_fill(~_kept(scaled, greedy, top_k, top_p), float("-inf"))
    return scaled


def _kept(scaled: Tensor, greedy: Tensor | None, top_k: Tensor, top_p: Tensor) -> Tensor:
    """[B, V] bool: the tokens top-k then top-p keep (greedy rows keep everything)."""
    vocab = scaled.shape[-1]
    srt, order = scaled.sort(dim=-1, descending=True, stable=True)  # [B, V]
    ranks = torch.arange(vocab, device=scaled.device)
    k = torch.where(top_k > 0, top_k.clamp(max=vocab), torch.full_like(top_k, vocab))
    p = torch.where(top_p >= 1.0, torch.full_like(top_p, 2.0), top_p)
    if greedy is not None:
        k = torch.where(greedy, torch.full_like(k, vocab), k)
        p = torch.where(greedy, torch.full_like(p, 2.0), p)
    keep = ranks.unsqueeze(0) < k.unsqueeze(-1)  # top-k is a prefix of the sorted row
    probs = torch.softmax(srt.masked_fill(~keep, float("-inf")), dim=-1)
    before = probs.cumsum(dim=-1) - probs  # renormalised mass strictly before each token
    keep &= before < p.unsqueeze(-1)
    return torch.zeros_like(keep).scatter_(-1, order, keep)

"""Behaviour corrections: weights and masks from rho_t = pi_prox(o_t) / mu(o_t).

Owns the ``CORRECTIONS`` registry. Every entry has the signature

    fn(prox_logprobs [B, T], behav_logprobs [B, T], mask [B, T], *, hyperparams)
        -> (weights [B, T] no grad, mask [B, T] float, metrics: dict[str, Tensor])

``mu`` is the distribution the engine sampled from; ``pi_prox`` the trainer's weights at the
start of the update. The weight multiplies the per-token surrogate (the decoupled objective,
docs/algorithms.md); the returned mask drops tokens or whole sequences (masked IS /
rejection). Weights are 0 wherever the returned mask is 0. Must not know about the
surrogate, models or staleness policy. The trait ``row_local=True`` says a sample's weights
and mask depend on that sample's tokens alone (every correction here: per token or per
sequence), so the trainer may leave other samples out of a pass without changing them.

Diagnostics, all 0-d tensors over the input mask: raw ratio mean/max/min, final weight mean,
normalised effective sample size ESS = (sum w)^2 / (N sum w^2) in (0, 1], the fraction of
tokens truncated or masked, and the k1 / k3 estimates of KL(mu || pi_prox).
"""

from __future__ import annotations

import torch
from torch import Tensor

from reroll.registry import Registry

CORRECTIONS = Registry("correction")


LOG_CLAMP = 20.0  # exp(+-20): ratios beyond are as good as infinite or zero


def _log_rho(prox: Tensor, behav: Tensor, mask: Tensor, name: str) -> tuple[Tensor, Tensor]:
    """(bool mask, log rho [B, T], 0 off the mask; not clamped), no grad. Per-token uses
    clamp each token's log-ratio; per-sequence uses clamp the sum (`_seq_sum`), so large
    per-token ratios of opposite sign cancel exactly as in the product."""
    if prox.shape != behav.shape or prox.shape != mask.shape or prox.dim() != 2:
        raise ValueError(f"correction {name!r}: prox_logprobs {tuple(prox.shape)}, behav_logprobs "
                         f"{tuple(behav.shape)} and mask {tuple(mask.shape)} must share one [B, T]")
    m = mask > 0
    return m, torch.where(m, prox.detach() - behav.detach(), torch.zeros_like(prox))


def _tok(log_rho: Tensor) -> Tensor:
    """Per-token ratio rho_t, its log clamped to [-20, 20]."""
    return log_rho.clamp(-LOG_CLAMP, LOG_CLAMP).exp()


def _seq_sum(log_rho: Tensor, m: Tensor) -> Tensor:
    """Sum of log rho over each sequence's trainable tokens, then clamped, broadcast to
    [B, T]: log of prod_t rho_t."""
    return (log_rho * m).sum(-1, keepdim=True).clamp(-LOG_CLAMP, LOG_CLAMP).expand_as(log_rho)


def _metrics(log_rho: Tensor, weights: Tensor, m: Tensor, dropped: Tensor) -> dict[str, Tensor]:
    fm = m.to(log_rho.dtype)
    n = fm.sum()
    denom = n.clamp(min=1.0)
    log_rho = log_rho.clamp(-LOG_CLAMP, LOG_CLAMP)  # diagnostics: finite whatever the gap
    rho = log_rho.exp()
    has = n > 0
    zero = torch.zeros((), dtype=log_rho.dtype, device=log_rho.device)
    w = weights * fm
    ess = w.sum() ** 2 / (denom * (w * w).sum()).clamp(min=1e-30)
    return {
        "is/ratio_mean": (rho * fm).sum() / denom,
        "is/ratio_max": torch.where(has, torch.where(m, rho, zero).max(), zero),
        "is/ratio_min": torch.where(has, torch.where(m, rho, rho.new_full((), float("inf"))).min(),
                                    zero),
        "is/weight_mean": w.sum() / denom,
        "is/ess": torch.where(w.sum() > 0, ess, zero),
        "is/dropped_frac": (dropped & m).to(fm.dtype).sum() / denom,
        "is/kl_k1": (-log_rho * fm).sum() / denom,
        "is/kl_k3": ((rho - 1.0 - log_rho) * fm).sum() / denom,
    }


def _out(weights: Tensor, keep: Tensor, m: Tensor, log_rho: Tensor, dropped: Tensor
         ) -> tuple[Tensor, Tensor, dict[str, Tensor]]:
    new_mask = (m & keep).to(log_rho.dtype)
    weights = weights * new_mask
    return weights, new_mask, _metrics(log_rho, weights, m, dropped)


@CORRECTIONS.register("none", row_local=True)
@torch.no_grad()
def none(prox_logprobs: Tensor, behav_logprobs: Tensor, mask: Tensor
         ) -> tuple[Tensor, Tensor, dict[str, Tensor]]:
    """w = 1: treat mu as pi_prox (diagnostics still describe their gap)."""
    m, log_rho = _log_rho(prox_logprobs, behav_logprobs, mask, "none")
    return _out(torch.ones_like(log_rho), m, m, log_rho, torch.zeros_like(m))


def _check_cap(name: str, cap: float) -> None:
    if not cap > 0:
        raise ValueError(f"correction {name!r}: cap must be > 0, got {cap}")


@CORRECTIONS.register("is_token", row_local=True)
@torch.no_grad()
def is_token(prox_logprobs: Tensor, behav_logprobs: Tensor, mask: Tensor
             ) -> tuple[Tensor, Tensor, dict[str, Tensor]]:
    """Plain IS per token, no cap: w_t = rho_t (its log clamped to [-20, 20] like every
    ratio here); no token is masked or truncated. DOTS's rollout replay weighs replayed
    tokens by the untruncated ratio to the policy that sampled them."""
    m, log_rho = _log_rho(prox_logprobs, behav_logprobs, mask, "is_token")
    return _out(_tok(log_rho), m, m, log_rho, torch.zeros_like(m))


@CORRECTIONS.register("tis_token", ranges={"cap": "(0, inf)"}, row_local=True)
@torch.no_grad()
def tis_token(prox_logprobs: Tensor, behav_logprobs: Tensor, mask: Tensor, *, cap: float = 2.0
              ) -> tuple[Tensor, Tensor, dict[str, Tensor]]:
    """Truncated IS per token: w_t = min(rho_t, cap); no token is masked."""
    _check_cap("tis_token", cap)
    m, log_rho = _log_rho(prox_logprobs, behav_logprobs, mask, "tis_token")
    rho = _tok(log_rho)
    return _out(rho.clamp(max=cap), m, m, log_rho, rho > cap)


@CORRECTIONS.register("tis_seq", ranges={"cap": "(0, inf)"}, row_local=True)
@torch.no_grad()
def tis_seq(prox_logprobs: Tensor, behav_logprobs: Tensor, mask: Tensor, *, cap: float = 2.0
            ) -> tuple[Tensor, Tensor, dict[str, Tensor]]:
    """Truncated IS per sequence: w_i = min(prod_t rho_t, cap) on every token of sequence i."""
    _check_cap("tis_seq", cap)
    m, log_rho = _log_rho(prox_logprobs, behav_logprobs, mask, "tis_seq")
    rho_seq = _seq_sum(log_rho, m).exp()  # [B, T]
    return _out(rho_seq.clamp(max=cap), m, m, log_rho, rho_seq > cap)


def _check_bounds(name: str, lower: float, upper: float) -> None:
    if not 0.0 <= lower < upper:
        raise ValueError(f"correction {name!r}: need 0 <= lower < upper, got lower={lower}, "
                         f"upper={upper}")


@CORRECTIONS.register("mis_token", ranges={"lower": "[0, inf)", "upper": "(0, inf)"},
                       row_local=True)
@torch.no_grad()
def mis_token(prox_logprobs: Tensor, behav_logprobs: Tensor, mask: Tensor, *,
              lower: float = 0.0, upper: float = 2.0) -> tuple[Tensor, Tensor, dict[str, Tensor]]:
    """Masked IS per token: w_t = rho_t where lower <= rho_t <= upper, else the token is masked.
    With lower = 0 and upper = AReaL's cap this is AReaL's decoupled-loss rule: a token whose
    behaviour weight exceeds the cap leaves the loss instead of being truncated to it."""
    _check_bounds("mis_token", lower, upper)
    m, log_rho = _log_rho(prox_logprobs, behav_logprobs, mask, "mis_token")
    rho = _tok(log_rho)
    keep = (rho >= lower) & (rho <= upper)
    return _out(rho, keep, m, log_rho, ~keep)


@CORRECTIONS.register("mis_seq", ranges={"lower": "[0, inf)", "upper": "(0, inf)"},
                       row_local=True)
@torch.no_grad()
def mis_seq(prox_logprobs: Tensor, behav_logprobs: Tensor, mask: Tensor, *,
            lower: float = 0.0, upper: float = 2.0) -> tuple[Tensor, Tensor, dict[str, Tensor]]:
    """Masked IS per sequence: w_i = prod_t rho_t if it lies in [lower, upper], else the whole
    sequence is masked."""
    _check_bounds("mis_seq", lower, upper)
    m, log_rho = _log_rho(prox_logprobs, behav_logprobs, mask, "mis_seq")
    rho_seq = _seq_sum(log_rho, m).exp()  # [B, T]
    keep = (rho_seq >= lower) & (rho_seq <= upper)
    return _out(rho_seq, keep, m, log_rho, ~keep)


@CORRECTIONS.register("mis_geo", ranges={"lower": "[0, inf)", "upper": "(0, inf)"},
                       row_local=True)
@torch.no_grad()
def mis_geo(prox_logprobs: Tensor, behav_logprobs: Tensor, mask: Tensor, *,
            lower: float = 0.999, upper: float = 1.001) -> tuple[Tensor, Tensor, dict[str, Tensor]]:
    """Geometric-mean rejection: keep sequence i (weight 1) only if
    (prod_t rho_t)^(1/|o_i|) lies in [lower, upper]; otherwise mask it. No IS reweighting:
    the geometric mean is a closeness test, not an unbiased weight."""
    _check_bounds("mis_geo", lower, upper)
    m, log_rho = _log_rho(prox_logprobs, behav_logprobs, mask, "mis_geo")
    n = m.sum(-1, keepdim=True).clamp(min=1)  # [B, 1]
    mean_log = ((log_rho * m).sum(-1, keepdim=True) / n).clamp(-LOG_CLAMP, LOG_CLAMP)
    geo = mean_log.exp().expand_as(log_rho)  # [B, T]
    keep = (geo >= lower) & (geo <= upper)
    return _out(torch.ones_like(log_rho), keep, m, log_rho, ~keep)


@CORRECTIONS.register("minpro", ranges={"cap": "(0, inf)"}, row_local=True)
@torch.no_grad()
def minpro(prox_logprobs: Tensor, behav_logprobs: Tensor, mask: Tensor, *, cap: float = 2.0
           ) -> tuple[Tensor, Tensor, dict[str, Tensor]]:
    """MinPRO (Lei et al. 2026, "A Step Back: Prefix Importance Ratio Stabilizes Policy
    Optimization"): w_t = min(rho_t, cap) * min(1, min_{j<t} rho_j).

    The prefix importance ratio prod_{j<t} rho_j is the exact correction for the context a
    token was sampled in, but its variance grows with t; the paper replaces it by the
    non-cumulative minimum of the earlier ratios, capped at 1, so a token that follows one
    which has become unlikely under the trainer is down-weighted and nothing is ever
    up-weighted by its prefix. Choices here: the current token does not count in its own
    prefix minimum (it enters through its own ratio, truncated at ``cap`` as in
    ``tis_token``, and through the surrogate's clip of pi_theta / pi_prox); the prefix uses
    rho_j = pi_prox / mu, the weights at the start of the update, so it is a constant of
    the update without gradient, like every weight here. Tokens off the
    mask (tool and environment tokens, padding) stay out of every minimum but keep their
    place: a model token after a tool call still sees the model tokens before it. A token
    counts as dropped when either factor cut it."""
    _check_cap("minpro", cap)
    m, log_rho = _log_rho(prox_logprobs, behav_logprobs, mask, "minpro")
    inf = torch.full_like(log_rho, float("inf"))
    running = torch.cummin(torch.where(m, log_rho, inf), dim=-1).values  # min_{j<=t}
    before = torch.cat([inf[:, :1], running[:, :-1]], dim=-1)  # min_{j<t}; +inf: none yet
    prefix = before.clamp(max=0.0).clamp(min=-LOG_CLAMP).exp()  # min(1, min_{j<t} rho_j)
    rho = _tok(log_rho)
    out = _out(rho.clamp(max=cap) * prefix, m, m, log_rho, (rho > cap) | (prefix < 1.0))
    fm = m.to(log_rho.dtype)
    out[2]["is/prefix_mean"] = (prefix * fm).sum() / fm.sum().clamp(min=1.0)
    return out


@CORRECTIONS.register("m2po", ranges={"threshold": "(0, inf)"}, row_local=False)
@torch.no_grad()
def m2po(prox_logprobs: Tensor, behav_logprobs: Tensor, mask: Tensor, *,
         threshold: float = 0.04) -> tuple[Tensor, Tensor, dict[str, Tensor]]:
    """M2PO (Zheng et al. 2025, "Prosperity before Collapse"; in AReaL): mask as few tokens
    as possible, largest second moment (log rho_t)^2 first, so that the mean of
    (log rho_t)^2 over the tokens kept is <= ``threshold``; kept tokens keep their
    untruncated weight w_t = rho_t (the second-moment bound replaces truncation).

    The mean is over the tokens this call sees (one micro-batch of the trainer), so the
    correction is not row-local: a sample's mask depends on the others passed with it.
    Among tokens of equal second moment the earlier one (row-major order) is masked first.
    Tokens off the mask never count."""
    if not threshold > 0:
        raise ValueError(f"correction 'm2po': threshold must be > 0, got {threshold}")
    m, log_rho = _log_rho(prox_logprobs, behav_logprobs, mask, "m2po")
    m2 = (log_rho.clamp(-LOG_CLAMP, LOG_CLAMP) ** 2).double()  # [B, T]
    flat = torch.where(m, m2, torch.full_like(m2, -1.0)).flatten()  # off the mask: last
    order = torch.sort(flat, descending=True, stable=True).indices
    vals = flat[order]
    n = int(m.sum())
    # masking the k largest leaves sum(vals[k:n]) over n - k tokens; the least k that meets
    # the threshold (k = n, an empty batch, always does)
    suffix = torch.cat([vals[:n].flip(0).cumsum(0).flip(0), vals.new_zeros(1)])  # [n + 1]
    kept_n = torch.arange(n, -1, -1, dtype=vals.dtype, device=vals.device)  # n - k
    ok = suffix <= threshold * kept_n
    k = int(ok.nonzero()[0]) if n > 0 else 0
    keep = torch.ones_like(flat, dtype=torch.bool)
    keep[order[:k]] = False
    keep = keep.view_as(m)
    return _out(_tok(log_rho), keep, m, log_rho, ~keep)

"""Per-token surrogate losses of the trust-region ratio pi_theta / pi_prox.

Owns the ``SURROGATES`` registry. Every entry has the signature

    fn(logprobs [B, T], prox_logprobs [B, T], advantages [B, T], mask [B, T], *, hyperparams)
        -> (per_token_loss [B, T], metrics: dict[str, Tensor])

The trait ``sequence_advantage=True`` marks a surrogate that trains one advantage per
sequence (the mean of A over its tokens: gspo), so per-token credit (a tree's segments,
`reroll.algo.tree_credit`) would be averaged away. ``inert_at_zero_advantage=True`` says
that a sample whose advantages are all 0 has loss 0 and gradient 0 (every loss here is A
times a finite factor), so the trainer may leave it out of the forward and backward passes
(`reroll.trainer.step`); a surrogate with a term of its own (an entropy bonus, say) must
not declare it.

The loss is per token and zero off the mask; reducing it to a scalar is the job of
``aggregation.py``, and the behaviour correction pi_prox / mu is the job of
``corrections.py``. Metrics are 0-d tensors, token-weighted means over the mask. Must not
know about models, configs or how the batch was built.

A hyperparameter's valid interval is declared once, in ``register(ranges=...)``: the config
check (`reroll.config_checks.validate`, through `Registry.check_kwargs`) and `Registry.bind`
refuse a value outside it. The clip checks inside the functions guard direct Python calls,
which pass through neither.
"""

from __future__ import annotations

import torch
from torch import Tensor

from reroll.registry import Registry

SURROGATES = Registry("surrogate")


def masked_mean(x: Tensor, mask: Tensor) -> Tensor:
    """Mean of x over mask > 0 (0 when the mask is empty); x, mask [B, T] -> 0-d."""
    return (x * mask).sum() / mask.sum().clamp(min=1.0)


def _prepare(logprobs: Tensor, prox_logprobs: Tensor, advantages: Tensor, mask: Tensor,
             where: str) -> tuple[Tensor, Tensor, Tensor]:
    """Check shapes; return (bool mask, log-ratio with zeros off the mask, advantages likewise).

    Zeroing before any exp keeps padded positions (which may hold -inf or garbage) from
    producing NaN values or NaN gradients.
    """
    for name, t in (("prox_logprobs", prox_logprobs), ("advantages", advantages), ("mask", mask)):
        if t.shape != logprobs.shape:
            raise ValueError(f"surrogate {where!r}: {name} has shape {tuple(t.shape)}, "
                             f"logprobs has {tuple(logprobs.shape)}")
    m = mask > 0
    log_ratio = torch.where(m, logprobs - prox_logprobs.detach(), torch.zeros_like(logprobs))
    adv = torch.where(m, advantages.detach(), torch.zeros_like(advantages))
    return m, log_ratio, adv


def _clip_loss(ratio: Tensor, adv: Tensor, clip_low: float, clip_high: float,
               dual_clip: float | None, m: Tensor, fm: Tensor) -> tuple[Tensor, dict[str, Tensor]]:
    """-min(r A, clip(r, 1-lo, 1+hi) A) [B, T], with optional dual clip, and clip fractions."""
    unclipped = -adv * ratio
    clipped = -adv * ratio.clamp(1.0 - clip_low, 1.0 + clip_high)
    loss = torch.maximum(unclipped, clipped)
    low = (adv < 0) & (ratio < 1.0 - clip_low)
    high = (adv > 0) & (ratio > 1.0 + clip_high)
    metrics = {"clip_frac_low": masked_mean(low.float(), fm),
               "clip_frac_high": masked_mean(high.float(), fm)}
    if dual_clip is not None:
        cap = -adv * dual_clip  # for A < 0 the loss may not exceed -c A
        dual = (adv < 0) & (loss > cap)
        loss = torch.where(adv < 0, torch.minimum(loss, cap), loss)
        metrics["clip_frac_dual"] = masked_mean(dual.float(), fm)
    return torch.where(m, loss, torch.zeros_like(loss)), metrics


def _check_clip(where: str, clip_low: float, clip_high: float, dual_clip: float | None) -> None:
    if not (0.0 <= clip_low < 1.0) or clip_high < 0.0:
        raise ValueError(f"surrogate {where!r}: need 0 <= clip_low < 1 and clip_high >= 0, "
                         f"got clip_low={clip_low}, clip_high={clip_high}")
    if dual_clip is not None and dual_clip <= 1.0:
        raise ValueError(f"surrogate {where!r}: dual_clip must be > 1, got {dual_clip}")


@SURROGATES.register("ppo_clip", ranges={"clip_low": "[0, 1)", "clip_high": "[0, inf)",
                                         "dual_clip": "(1, inf)"},
                      inert_at_zero_advantage=True)
def ppo_clip(logprobs: Tensor, prox_logprobs: Tensor, advantages: Tensor, mask: Tensor, *,
             clip_low: float = 0.2, clip_high: float = 0.2, dual_clip: float | None = None
             ) -> tuple[Tensor, dict[str, Tensor]]:
    """PPO clip on r_t = exp(clamp(log pi_theta - log pi_prox, -20, 20)).

    loss_t = -min(r A, clip(r, 1 - clip_low, 1 + clip_high) A); with ``dual_clip = c`` the
    loss of a negative-advantage token is capped at -c A (Ye et al. 2019).
    """
    _check_clip("ppo_clip", clip_low, clip_high, dual_clip)
    m, log_ratio, adv = _prepare(logprobs, prox_logprobs, advantages, mask, "ppo_clip")
    fm = m.to(logprobs.dtype)
    ratio = log_ratio.clamp(-20.0, 20.0).exp()  # [B, T]
    loss, metrics = _clip_loss(ratio, adv, clip_low, clip_high, dual_clip, m, fm)
    metrics["ppo_kl"] = masked_mean(-log_ratio.detach(), fm)
    return loss, metrics


def _seq_log_ratio(log_ratio: Tensor, fm: Tensor) -> Tensor:
    """(1/|o_i|) sum_t m (log pi_theta - log pi_prox) [B, 1], clamped to [-20, 10]."""
    n = fm.sum(-1, keepdim=True).clamp(min=1.0)  # [B, 1]
    return ((log_ratio * fm).sum(-1, keepdim=True) / n).clamp(-20.0, 10.0)


def _seq_advantage(adv: Tensor, fm: Tensor) -> Tensor:
    """Per-sequence advantage [B, 1]: the mean of A over the sequence's trainable tokens."""
    return (adv * fm).sum(-1, keepdim=True) / fm.sum(-1, keepdim=True).clamp(min=1.0)


@SURROGATES.register("gspo", ranges={"clip_low": "[0, 1)", "clip_high": "[0, inf)"},
                      sequence_advantage=True, inert_at_zero_advantage=True)
def gspo(logprobs: Tensor, prox_logprobs: Tensor, advantages: Tensor, mask: Tensor, *,
         clip_low: float = 3e-4, clip_high: float = 4e-4) -> tuple[Tensor, dict[str, Tensor]]:
    """GSPO: one length-normalised ratio per sequence, s_i = exp(mean_t log r_t).

    loss_i = -min(s_i A_i, clip(s_i, 1 - lo, 1 + hi) A_i), A_i the sequence's mean advantage,
    written on every trainable token of sequence i (so ``seq_mean_token_mean`` recovers
    (1/B) sum_i loss_i). A sequence is wholly inside or outside the trust region.
    """
    _check_clip("gspo", clip_low, clip_high, None)
    m, log_ratio, adv = _prepare(logprobs, prox_logprobs, advantages, mask, "gspo")
    fm = m.to(logprobs.dtype)
    s = _seq_log_ratio(log_ratio, fm).exp()  # [B, 1]
    a = _seq_advantage(adv, fm)  # [B, 1]
    loss, metrics = _clip_loss(s.expand_as(fm), a.expand_as(fm), clip_low, clip_high, None, m, fm)
    metrics["ppo_kl"] = masked_mean(-log_ratio.detach(), fm)
    return loss, metrics


@SURROGATES.register("gspo_token", ranges={"clip_low": "[0, 1)", "clip_high": "[0, inf)"},
                      inert_at_zero_advantage=True)
def gspo_token(logprobs: Tensor, prox_logprobs: Tensor, advantages: Tensor, mask: Tensor, *,
               clip_low: float = 3e-4, clip_high: float = 4e-4
               ) -> tuple[Tensor, dict[str, Tensor]]:
    """GSPO-token: s_{i,t} = sg[s_i] * pi_theta(o_t) / sg[pi_theta(o_t)], per-token A_{i,t}.

    Numerically s_{i,t} = s_i; with equal advantages over a sequence it has GSPO's gradient.
    """
    _check_clip("gspo_token", clip_low, clip_high, None)
    m, log_ratio, adv = _prepare(logprobs, prox_logprobs, advantages, mask, "gspo_token")
    fm = m.to(logprobs.dtype)
    seq = _seq_log_ratio(log_ratio, fm).detach()  # [B, 1]
    ratio = (seq + log_ratio - log_ratio.detach()).exp()  # [B, T], value s_i
    loss, metrics = _clip_loss(ratio, adv, clip_low, clip_high, None, m, fm)
    metrics["ppo_kl"] = masked_mean(-log_ratio.detach(), fm)
    return loss, metrics


@SURROGATES.register("reinforce", ranges={"ratio_cap": "(0, inf)"},
                      inert_at_zero_advantage=True)
def reinforce(logprobs: Tensor, prox_logprobs: Tensor, advantages: Tensor, mask: Tensor, *,
              ratio: bool = False, ratio_cap: float | None = None
              ) -> tuple[Tensor, dict[str, Tensor]]:
    """Plain policy gradient, loss_t = -A_t log pi_theta(o_t), no trust region.

    ``ratio=True`` multiplies by sg[pi_theta / pi_prox] (truncated at ``ratio_cap`` if set),
    which corrects for earlier updates within the same batch. The loss value is not an
    objective estimate (it depends on the log-prob level); its gradient is the estimator.
    """
    if ratio_cap is not None and ratio_cap <= 0:
        raise ValueError(f"surrogate 'reinforce': ratio_cap must be > 0, got {ratio_cap}")
    m, log_ratio, adv = _prepare(logprobs, prox_logprobs, advantages, mask, "reinforce")
    fm = m.to(logprobs.dtype)
    logp = torch.where(m, logprobs, torch.zeros_like(logprobs))
    weight = torch.ones_like(logp)
    metrics: dict[str, Tensor] = {}
    if ratio:
        weight = log_ratio.detach().clamp(-20.0, 20.0).exp()
        if ratio_cap is not None:
            metrics["ratio_capped_frac"] = masked_mean((weight > ratio_cap).float(), fm)
            weight = weight.clamp(max=ratio_cap)
    loss = torch.where(m, -adv * weight * logp, torch.zeros_like(logp))
    metrics["ppo_kl"] = masked_mean(-log_ratio.detach(), fm)
    return loss, metrics

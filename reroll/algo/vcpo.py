"""VCPO's variance controls for off-policy updates (docs/algorithms.md), as pure math.

Owns three things:

* sequence importance weights ``w_i = exp(sum_t [log pi_prox(o_t) - log mu(o_t)])`` over a
  sample's loss tokens (optionally clipped at a cap, then times the sample's own weight),
  kept as logs: a long or stale sequence's weight overflows a float long before its log does;
* the effective sample size ``ESS = (sum w)^2 / sum w^2`` of a mini-batch, ``rho = ESS / B``,
  and the learning-rate factor ``min(1, rho / rho_base)^(1/2)`` (``LR_RULES``: ``sqrt`` for
  Adam-type optimisers, ``linear``) the trainer applies to that mini-batch's optimiser step;
* the off-policy optimal baseline (OPOB), registered as the advantage estimator ``opob``:
  ``b* = sum_i u_i R_i / sum_i u_i`` with ``u_i = w_i^2 ||grad log pi_theta(tau_i)||^2``
  (optionally ``/ L_i^2``) per group or per mini-batch, and ``A_i = R_i - b*``. It needs each
  sample's gradient norm, which the trainer computes when an estimator declares a
  ``grad_sq_norms`` parameter (`reroll.trainer.sample_grads`).

Must not know about models, batches, optimisers or configs.
"""

from __future__ import annotations

import math

import torch
from torch import Tensor

from reroll.algo.advantages import ADVANTAGES
from reroll.algo.groups import check_inputs, dense_ids, group_std
from reroll.registry import Registry

LR_RULES = Registry("ESS learning-rate rule")


@torch.no_grad()
def seq_log_weights(prox_logprobs: Tensor, behav_logprobs: Tensor, mask: Tensor,
                    sample_weights: Tensor | None = None, cap: float = 0.0) -> Tensor:
    """log w_i [B] of each sample: sum over its loss tokens of log pi_prox - log mu, clipped
    at ``log cap`` when ``cap > 0``, plus log of its sample weight [B] (1: none). A sample with
    no loss token, or with weight 0, is out of the estimate: -inf.

    prox_logprobs, behav_logprobs, mask: [B, T]."""
    if prox_logprobs.shape != behav_logprobs.shape or prox_logprobs.shape != mask.shape:
        raise ValueError(f"seq_log_weights: prox_logprobs {tuple(prox_logprobs.shape)}, "
                         f"behav_logprobs {tuple(behav_logprobs.shape)} and mask "
                         f"{tuple(mask.shape)} must share one [B, T]")
    m = mask > 0
    diff = torch.where(m, prox_logprobs.double() - behav_logprobs.double(),
                       torch.zeros((), dtype=torch.float64, device=mask.device))
    log_w = diff.sum(-1)  # [B]
    if cap > 0:
        log_w = log_w.clamp(max=math.log(cap))
    if sample_weights is not None:
        log_w = log_w + sample_weights.double().log()  # weight 0: -inf
    return torch.where(m.any(-1), log_w, torch.full_like(log_w, -math.inf))


def _shifted(log_w: Tensor) -> Tensor:
    """exp(log_w - max log_w) [N] in float64: weights scaled so the largest is 1 (ESS and
    OPOB are ratios, so the scale cancels); all exactly 1 when every log_w is equal."""
    return (log_w.double() - log_w.double().max()).exp()


@torch.no_grad()
def effective_sample_size(log_w: Tensor) -> tuple[float, float]:
    """(ESS, ESS / B) of the samples with a finite log weight [N]; B counts them. With no
    such sample there is nothing to weigh: (0.0, 1.0), which leaves a learning rate alone."""
    log_w = log_w[torch.isfinite(log_w)]
    if log_w.numel() == 0:
        return 0.0, 1.0
    u = _shifted(log_w)  # [B]
    ess = float(u.sum() ** 2 / (u * u).sum())
    return ess, ess / log_w.numel()


@LR_RULES.register("sqrt")
def sqrt_rule(ratio: float) -> float:
    """lr factor sqrt(ratio): Adam normalises the gradient's scale, so its step variance
    shrinks with the square root of the effective batch."""
    return ratio ** 0.5


@LR_RULES.register("linear")
def linear_rule(ratio: float) -> float:
    """lr factor = ratio (plain SGD's step variance is linear in 1 / batch)."""
    return ratio


def ess_lr_scale(ess_ratio: float, base_ratio: float, rule: str) -> float:
    """The factor on a mini-batch's learning rate: rule(min(1, ess_ratio / base_ratio)).
    ``base_ratio`` in (0, 1]: ESS ratios at or above it keep the full learning rate."""
    if not 0.0 < base_ratio <= 1.0:
        raise ValueError(f"ess_lr_scale: base_ratio must be in (0, 1], got {base_ratio}")
    return LR_RULES.get(rule)(min(1.0, ess_ratio / base_ratio))


@torch.no_grad()
def opob_baseline(values: Tensor, log_w: Tensor, grad_sq_norms: Tensor, scope: Tensor,
                  lengths: Tensor | None = None) -> Tensor:
    """b* of each sample's scope, per sample [N] (float64):

        b*_s = sum_{i in s} u_i v_i / sum_{i in s} u_i,   u_i = w_i^2 ||g_i||^2 (/ L_i^2)

    values [N] (rewards), log_w [N] (log sequence IS weights; -inf: left out),
    grad_sq_norms [N] (||grad log pi(tau_i)||^2), scope [N] (any integer ids: a group or a
    mini-batch), lengths [N] (loss tokens, for the 1/L^2 factor; a sample with none is left
    out). A scope whose weights are all 0 (every gradient norm 0, or every sample left out)
    takes the plain mean of its values: with equal weights that is what the formula gives.
    b* is a convex combination, so it is clamped into [min, max] of its scope's values (an
    all-equal group gets exactly its value back, not one rounded by the weights)."""
    v = values.double()
    ids, n = dense_ids(scope)
    log_u = 2.0 * log_w.double() + grad_sq_norms.double().log()  # [N]; norm 0: -inf
    if lengths is not None:
        L = lengths.double()
        log_u = torch.where(L > 0, log_u - 2.0 * L.clamp(min=1.0).log(),
                            torch.full_like(log_u, -math.inf))
    log_u = torch.nan_to_num(log_u, nan=-math.inf)
    f64 = dict(dtype=torch.float64, device=v.device)
    top = torch.full((n,), -math.inf, **f64).scatter_reduce(
        0, ids, log_u, "amax")  # [S]
    u = torch.where(torch.isfinite(top[ids]), (log_u - top[ids]).exp(),
                    torch.zeros_like(log_u))  # [N], the largest of each scope is 1
    den = torch.zeros(n, **f64).index_add_(0, ids, u)  # [S]
    num = torch.zeros(n, **f64).index_add_(0, ids, u * v)  # [S]
    size = torch.zeros(n, **f64).index_add_(0, ids, torch.ones_like(v))  # [S]
    mean = torch.zeros(n, **f64).index_add_(0, ids, v) / size  # [S]
    b = torch.where(den > 0, num / den.clamp(min=1e-300), mean)  # [S]
    lo = torch.full((n,), math.inf, **f64).scatter_reduce(0, ids, v, "amin")
    hi = torch.full((n,), -math.inf, **f64).scatter_reduce(0, ids, v, "amax")
    return torch.minimum(torch.maximum(b, lo), hi)[ids]


def _check_opob_args(*, scope: str = "group", **_: object) -> None:
    """The load-time check of ``opob``'s non-numeric hyperparameters (registry trait
    ``check``, called by `reroll.config_checks`)."""
    if scope not in ("group", "minibatch"):
        raise ValueError(f"advantage 'opob': scope must be group or minibatch, got {scope!r}")


@ADVANTAGES.register("opob", ranges={"is_cap": "[0, inf)", "eps": "[0, 1]"},
                     check=_check_opob_args)
def opob(rewards: Tensor, components: Tensor, group_index: Tensor,
         token_counts: Tensor | None = None, seq_log_weights: Tensor | None = None,
         grad_sq_norms: Tensor | None = None, minibatch_index: Tensor | None = None, *,
         scope: str = "group", norm_by_std: bool = True, length_norm: bool = False,
         is_cap: float = 0.0, eps: float = 1e-6) -> tuple[Tensor, Tensor]:
    """VCPO's off-policy optimal baseline: A_i = (R_i - b*_s) / (std_s R + eps), with b*_s
    the variance-minimising baseline of sample i's scope (``opob_baseline``).

    ``scope``: "group" (its prompt's samples) or "minibatch" (the samples of its trainer
    mini-batch). ``norm_by_std``: divide by the scope's unbiased reward std (as GRPO; False:
    A = R - b*). ``length_norm``: weights / L_i^2. ``is_cap`` (> 0): clip w_i there for the
    baseline. The trainer supplies ``seq_log_weights`` (log w_i [N] at the weights the update
    starts from, the sample weight folded in), ``grad_sq_norms`` [N] (||grad_theta sum_t
    log pi_theta(o_t)||^2 over the sample's loss tokens, same weights), ``token_counts`` [N]
    and ``minibatch_index`` [N]. With every w_i and ||g_i|| equal, b* is the scope's mean."""
    where = "advantage 'opob'"
    check_inputs(rewards, components, group_index, where)
    _check_opob_args(scope=scope)
    if seq_log_weights is None or grad_sq_norms is None:
        raise ValueError(f"{where}: needs seq_log_weights and grad_sq_norms per sample (the "
                         f"trainer computes them for an estimator that declares them)")
    ids = group_index
    if scope == "minibatch":
        if minibatch_index is None:
            raise ValueError(f"{where}: scope 'minibatch' needs minibatch_index per sample")
        ids = minibatch_index
    log_w = seq_log_weights.double()
    if is_cap > 0:
        log_w = log_w.clamp(max=math.log(is_cap))
    lengths = token_counts if length_norm else None
    if length_norm and lengths is None:
        raise ValueError(f"{where}: length_norm needs token_counts per sample")
    b = opob_baseline(rewards, log_w, grad_sq_norms, ids, lengths)  # [N]
    adv = rewards.double() - b
    if norm_by_std:
        dense, n = dense_ids(ids)
        adv = adv / (group_std(rewards.double(), dense, n) + eps)
    return adv.to(rewards.dtype), torch.ones(rewards.shape[0], dtype=torch.bool,
                                             device=rewards.device)


opob.group_normalised = True  # its default scope's baseline is the group's own samples

"""KL estimators between the policy and a frozen reference, and the reward-side penalty.

Owns the ``KL_ESTIMATORS`` registry. Every entry has the signature

    fn(logprobs [B, T], ref_logprobs [B, T]) -> kl [B, T]

per sampled token, with delta = log pi(a) - log pi_ref(a):
k1 = delta, k2 = delta^2 / 2, k3 = exp(-delta) - 1 + delta. Placement is the caller's
choice: in the loss (aggregated like the policy loss, gradient flows through ``logprobs``)
or in the reward (``kl_reward_penalty``, no gradient). Must not know about models or
configs. Estimators and placement: docs/algorithms.md (KL).
"""

from __future__ import annotations

from collections.abc import Callable

import torch
from torch import Tensor

from reroll.registry import Registry

KL_ESTIMATORS = Registry("KL estimator")


def _delta(logprobs: Tensor, ref_logprobs: Tensor, name: str) -> Tensor:
    if logprobs.shape != ref_logprobs.shape:
        raise ValueError(f"KL estimator {name!r}: logprobs {tuple(logprobs.shape)} and "
                         f"ref_logprobs {tuple(ref_logprobs.shape)} differ in shape")
    return logprobs - ref_logprobs.detach()


@KL_ESTIMATORS.register("k1")
def k1(logprobs: Tensor, ref_logprobs: Tensor) -> Tensor:
    """delta: unbiased for KL(pi || pi_ref), high variance, can be negative."""
    return _delta(logprobs, ref_logprobs, "k1")


@KL_ESTIMATORS.register("k2")
def k2(logprobs: Tensor, ref_logprobs: Tensor) -> Tensor:
    """delta^2 / 2: biased, low variance; as a loss its gradient is the reverse-KL gradient."""
    return 0.5 * _delta(logprobs, ref_logprobs, "k2") ** 2


@KL_ESTIMATORS.register("k3")
def k3(logprobs: Tensor, ref_logprobs: Tensor) -> Tensor:
    """exp(-delta) - 1 + delta >= 0, delta clamped to [-20, 20] and the result to [-10, 10]."""
    d = _delta(logprobs, ref_logprobs, "k3").clamp(-20.0, 20.0)
    return (torch.exp(-d) - 1.0 + d).clamp(-10.0, 10.0)


def kl_reward_penalty(estimator: Callable[[Tensor, Tensor], Tensor], logprobs: Tensor,
                      ref_logprobs: Tensor, mask: Tensor, coef: float) -> Tensor:
    """Per-token reward penalty coef * k(t) [B, T], zero off the mask, without gradient.

    ``logprobs`` are the behaviour or proximal log-probs of the sampled tokens; the caller
    subtracts the penalty from the per-token reward (or its sum from the outcome reward).
    """
    if mask.shape != logprobs.shape:
        raise ValueError(f"kl_reward_penalty: mask {tuple(mask.shape)} and logprobs "
                         f"{tuple(logprobs.shape)} differ in shape")
    with torch.no_grad():
        m = mask > 0
        lp = torch.where(m, logprobs, torch.zeros_like(logprobs))
        ref = torch.where(m, ref_logprobs, torch.zeros_like(ref_logprobs))
        return torch.where(m, coef * estimator(lp, ref), torch.zeros_like(lp))

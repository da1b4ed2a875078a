"""Advantage estimators: outcome rewards of complete groups -> one scalar per sample.

Owns the ``ADVANTAGES`` registry. Every entry has the signature

    fn(rewards [N] float, components [N, K] float, group_index [N] long, *, hyperparams)
        -> (advantages [N], include [N] bool)

An estimator that declares per-token inputs (``token_kl``, ``token_mask``: REINFORCE++'s
returns under a KL penalty in the reward) returns advantages [N, T] when it gets them.

``include`` is False for samples that were generated and scored but must not contribute to
the loss (MC-GRPO's pivot). Outcome-reward methods broadcast the scalar over a sample's
tokens; that is the caller's job. Advantages are a pure function of the groups, so a recorded
run can be replayed under another estimator. Must not know about tokens, models or configs.
Each estimator's paper and rule: docs/algorithms.md (advantage estimators).
"""

from __future__ import annotations

import torch
from torch import Tensor

from reroll.algo.groups import (
    check_inputs,
    dense_ids,
    group_mean,
    group_median,
    group_std,
    singleton,
    whiten,
)
from reroll.registry import METHODS, Registry

ADVANTAGES = Registry("advantage", plugins=METHODS)


def _all(rewards: Tensor) -> Tensor:
    """include [N]: every sample, on the rewards' device."""
    return torch.ones(rewards.shape[0], dtype=torch.bool, device=rewards.device)


def _group_normalise(x: Tensor, ids: Tensor, n_groups: int, norm_by_std: bool,
                     eps: float) -> Tensor:
    """GRPO's per-group normalisation of x [N]; a singleton keeps its raw value (mean 0, std 1)."""
    alone = singleton(ids, n_groups)  # [N]
    mean = torch.where(alone, torch.zeros_like(x), group_mean(x, ids, n_groups))  # [N]
    if not norm_by_std:
        return x - mean
    std = torch.where(alone, torch.ones_like(x), group_std(x, ids, n_groups))  # [N]
    return (x - mean) / (std + eps)


@ADVANTAGES.register("grpo", ranges={"eps": "[0, 1]"})
def grpo(rewards: Tensor, components: Tensor, group_index: Tensor, *,
         norm_by_std: bool = True, eps: float = 1e-6) -> tuple[Tensor, Tensor]:
    """A_i = (R_i - mean_g R) / (std_g R + eps), unbiased std.

    ``norm_by_std=False`` gives Dr.GRPO's A_i = R_i - mean_g R. A singleton group uses mean 0
    and std 1, so the lone sample keeps its raw reward (divided by 1 + eps).
    """
    check_inputs(rewards, components, group_index, "advantage 'grpo'")
    ids, g = dense_ids(group_index)
    return _group_normalise(rewards, ids, g, norm_by_std, eps), _all(rewards)


@ADVANTAGES.register("rloo")
def rloo(rewards: Tensor, components: Tensor, group_index: Tensor) -> tuple[Tensor, Tensor]:
    """Leave-one-out baseline: A_i = R_i - mean_{j != i} R_j = k/(k-1) (R_i - mean_g R).

    A singleton group has no other sample to form a baseline: its advantage is 0 (it carries
    no learning signal rather than its raw reward).
    """
    check_inputs(rewards, components, group_index, "advantage 'rloo'")
    ids, g = dense_ids(group_index)
    k = torch.bincount(ids, minlength=g).to(rewards.dtype)[ids]  # [N]
    centred = rewards - group_mean(rewards, ids, g)  # [N]
    adv = torch.where(k > 1, centred * k / (k - 1).clamp(min=1), torch.zeros_like(rewards))
    return adv, _all(rewards)


KL_RETURNS = ("token", "folded")  # reinforce_pp's placements of a KL penalty in the reward


@ADVANTAGES.register("reinforce_pp", ranges={"eps": "[0, 1]"})
def reinforce_pp(rewards: Tensor, components: Tensor, group_index: Tensor,
                 token_counts: Tensor | None = None, token_kl: Tensor | None = None,
                 token_mask: Tensor | None = None, *, baseline: bool = False, eps: float = 1e-6,
                 kl_returns: str = "token") -> tuple[Tensor, Tensor]:
    """REINFORCE++: the return (gamma = 1) whitened over all valid tokens of the batch.

    ``baseline=True`` subtracts the group mean of the outcome rewards first
    (REINFORCE++-baseline), with no per-group std; a singleton group's mean is taken as 0
    (GRPO's rule), so its lone sample keeps its reward rather than getting 0.

    Without a KL penalty in the reward every token of a sample has the same return, the
    outcome reward: the result is per sample [N], whitened with ``token_counts`` [N] (each
    sample's trainable tokens) so that a sample weighs as many tokens as it has.

    With the penalty (the trainer passes ``token_kl`` [N, T], kl_coef * k(t) per token and 0
    off the mask, and ``token_mask`` [N, T]) and ``kl_returns = "token"`` (the default, as
    REINFORCE++ defines it), token t's return is the reward less the penalties from t to the
    end of its response, G_t = x - sum_{s >= t} kl_s, and the returns of all valid tokens
    are whitened together: advantages [N, T], 0 off the mask. ``kl_returns = "folded"`` is
    reroll's earlier variant: the whole response's penalty leaves the reward,
    x = R - sum_t kl_t, one return per sample [N] (as RLOO does).
    """
    check_inputs(rewards, components, group_index, "advantage 'reinforce_pp'")
    if kl_returns not in KL_RETURNS:
        raise ValueError(f"advantage 'reinforce_pp': kl_returns must be one of {KL_RETURNS}, "
                         f"got {kl_returns!r}")
    x = rewards
    per_token = token_kl is not None and kl_returns == "token"
    if token_kl is not None and not per_token:
        x = rewards - token_kl.sum(-1)
    if baseline:
        ids, g = dense_ids(group_index)
        mean = torch.where(singleton(ids, g), torch.zeros_like(x), group_mean(x, ids, g))
        x = x - mean
    if not per_token:
        return whiten(x, eps, token_counts), _all(rewards)
    if token_mask is None or token_mask.shape != token_kl.shape or token_kl.shape[0] != x.shape[0]:
        raise ValueError("advantage 'reinforce_pp': token_kl needs a token_mask of its shape "
                         f"[N, T] with N = {x.shape[0]}")
    m = token_mask > 0  # [N, T]
    pen = torch.where(m, token_kl.to(x.dtype), torch.zeros_like(token_kl, dtype=x.dtype))
    to_go = pen.flip(-1).cumsum(-1).flip(-1)  # [N, T]: sum_{s >= t} kl_s
    returns = x[:, None] - to_go  # [N, T]
    adv = torch.zeros_like(returns)
    adv[m] = whiten(returns[m], eps)
    return adv, _all(rewards)


@ADVANTAGES.register("mc_grpo", ranges={"mad_eps": "[0, 1]"})
def mc_grpo(rewards: Tensor, components: Tensor, group_index: Tensor, *,
            mad_eps: float = 1e-3, zero_mad: str = "std") -> tuple[Tensor, Tensor]:
    """Median-centred GRPO: A_i = (R_i - median_g R) / (scale_g + mad_eps).

    scale_g is the median absolute deviation MAD_g = median_g |R_j - median_g R|. One median
    member per group (the pivot, see ``groups.group_median``) has A = 0 and include = False,
    so a group of G+1 samples trains on G. Groups should have odd size; even sizes use the
    lower median.

    With binary rewards MAD is usually 0 (e.g. rewards 1,0,0), which would give the minority
    sample |A| = 1/mad_eps = 1000. ``zero_mad`` picks the scale used when MAD_g = 0:
    ``"std"`` (default) the group's unbiased std, ``"one"`` a scale of 1, ``"eps"`` none
    (the reference code's behaviour). A group with all rewards equal gets A = 0 either way.
    """
    check_inputs(rewards, components, group_index, "advantage 'mc_grpo'")
    if zero_mad not in ("std", "one", "eps"):
        raise ValueError(f"advantage 'mc_grpo': zero_mad must be std, one or eps, got {zero_mad!r}")
    ids, g = dense_ids(group_index)
    median, pivot = group_median(rewards, ids, g)  # [N], [N]
    dev = rewards - median  # [N]
    mad, _ = group_median(dev.abs(), ids, g)  # [N]
    fallback = {"std": group_std(rewards, ids, g), "one": torch.ones_like(rewards),
                "eps": torch.zeros_like(rewards)}[zero_mad]  # [N]
    scale = torch.where(mad > 0, mad, fallback)  # [N]
    adv = torch.where(pivot, torch.zeros_like(dev), dev / (scale + mad_eps))
    return adv, ~pivot


@ADVANTAGES.register("gdpo", ranges={"eps": "[0, 1]"})
def gdpo(rewards: Tensor, components: Tensor, group_index: Tensor, *,
         component_weights: list[float] | None = None, eps: float = 1e-6
         ) -> tuple[Tensor, Tensor]:
    """Group reward-decoupled normalisation over the K reward components.

    Each component is GRPO-normalised within its group (unbiased std, singleton: raw value),
    the normalised components are summed with ``component_weights`` (default all 1), and the
    sum is whitened over the whole batch. The scalar ``rewards`` are not used.
    """
    check_inputs(rewards, components, group_index, "advantage 'gdpo'")
    k = components.shape[1]
    w = torch.ones(k, device=components.device) if component_weights is None \
        else torch.tensor(component_weights, device=components.device)
    if w.shape != (k,):
        raise ValueError(f"advantage 'gdpo': component_weights has {w.numel()} entries "
                         f"but the batch has K={k} reward components")
    ids, g = dense_ids(group_index)
    normed = torch.stack([_group_normalise(components[:, j], ids, g, True, eps)
                          for j in range(k)], dim=1)  # [N, K]
    summed = normed @ w.to(normed.dtype)  # [N]
    return whiten(summed, eps), _all(rewards)


gdpo.uses_scalar_reward = False  # read by config_checks.validate: reward shaping cannot reach it


for _fn in (grpo, rloo, mc_grpo, gdpo):  # their baseline is the group's own samples
    _fn.group_normalised = True

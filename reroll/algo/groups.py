"""Per-group statistics over a flat batch of samples (pure tensor math).

Owns the vectorised "which group is each sample in" arithmetic shared by the advantage
estimators: group sizes, means, unbiased standard deviations, lower medians and the median
member of each group. Groups are given by an integer id per sample; ids need not be
contiguous or sorted, and groups may have different sizes. Must not know about rollouts,
losses or any particular estimator.
"""

from __future__ import annotations

import torch
from torch import Tensor


def check_inputs(rewards: Tensor, components: Tensor, group_index: Tensor, where: str) -> None:
    """Raise a ValueError naming ``where`` when the advantage inputs are malformed."""
    if rewards.dim() != 1:
        raise ValueError(f"{where}: rewards must be 1-D [N], got shape {tuple(rewards.shape)}")
    n = rewards.shape[0]
    if n == 0:
        raise ValueError(f"{where}: empty batch (no rewards)")
    if group_index.shape != (n,):
        raise ValueError(f"{where}: group_index must be [N]={n}, got {tuple(group_index.shape)}")
    if group_index.dtype not in (torch.int32, torch.int64):
        raise ValueError(f"{where}: group_index must be an integer tensor, got {group_index.dtype}")
    if components.dim() != 2 or components.shape[0] != n:
        raise ValueError(f"{where}: components must be [N={n}, K], got {tuple(components.shape)}")
    if not torch.isfinite(rewards).all():
        bad = torch.nonzero(~torch.isfinite(rewards)).flatten().tolist()
        raise ValueError(f"{where}: non-finite rewards at samples {bad[:10]}")
    if not torch.isfinite(components).all():
        bad = torch.nonzero(~torch.isfinite(components).all(-1)).flatten().tolist()
        raise ValueError(f"{where}: non-finite reward components at samples {bad[:10]}")


def dense_ids(group_index: Tensor) -> tuple[Tensor, int]:
    """Map arbitrary group ids [N] to 0..G-1 [N]; returns (ids, G)."""
    uniq, inv = torch.unique(group_index, return_inverse=True)
    return inv, int(uniq.numel())


def group_sizes(ids: Tensor, n_groups: int) -> Tensor:
    """Samples per group [G] (float) from dense ids [N]."""
    return torch.bincount(ids, minlength=n_groups).to(torch.float64)


def group_mean(x: Tensor, ids: Tensor, n_groups: int) -> Tensor:
    """Mean of x [N] within each group, gathered back per sample [N]."""
    x64 = x.to(torch.float64)
    sums = torch.zeros(n_groups, dtype=torch.float64, device=x.device).index_add_(
        0, ids, x64)  # [G]
    return (sums / group_sizes(ids, n_groups))[ids].to(x.dtype)


def group_std(x: Tensor, ids: Tensor, n_groups: int) -> Tensor:
    """Unbiased (n-1) std of x [N] within each group, per sample [N]; 0 for singletons."""
    x64 = x.to(torch.float64)
    mean = group_mean(x64, ids, n_groups)  # [N]
    sq = torch.zeros(n_groups, dtype=torch.float64, device=x.device).index_add_(
        0, ids, (x64 - mean) ** 2)  # [G]
    dof = (group_sizes(ids, n_groups) - 1.0).clamp(min=1.0)  # [G]
    return (sq / dof).sqrt()[ids].to(x.dtype)


def singleton(ids: Tensor, n_groups: int) -> Tensor:
    """True [N] for samples alone in their group."""
    return group_sizes(ids, n_groups)[ids] == 1


def group_median(x: Tensor, ids: Tensor, n_groups: int) -> tuple[Tensor, Tensor]:
    """Lower median of x [N] per group, per sample [N]; and a pivot flag [N] bool.

    The lower median (the ((n-1)//2)-th smallest, torch.median's convention) is always the
    value of a member, so exactly one member per group is flagged as the pivot: the
    ((n-1)//2)-th in ascending order, ties broken by position in the batch.
    """
    n = x.shape[0]
    by_value = torch.sort(x, stable=True).indices  # [N]
    order = by_value[torch.sort(ids[by_value], stable=True).indices]  # [N] group-major, by value
    sizes = torch.bincount(ids, minlength=n_groups)  # [G]
    starts = torch.cumsum(sizes, 0) - sizes  # [G] first sorted position of each group
    pivot_pos = starts + (sizes - 1) // 2  # [G]
    pivot_sample = order[pivot_pos]  # [G] batch index of each group's median member
    median = x[pivot_sample][ids]  # [N]
    is_pivot = torch.zeros(n, dtype=torch.bool, device=x.device)
    is_pivot[pivot_sample] = True
    return median, is_pivot


def whiten(x: Tensor, eps: float, weights: Tensor | None = None) -> Tensor:
    """(x - mean) / (std + eps) over the whole batch [N], unbiased std; 0s for N = 1.

    ``weights`` [N] (token counts): each sample counts as that many tokens, as whitening
    "over all valid tokens of the batch" does when a sample's advantage is broadcast over
    its tokens: mean = sum w x / W, var = sum w (x - mean)^2 / (W - 1), W = sum w."""
    if weights is None:
        if x.numel() < 2:
            return torch.zeros_like(x)
        return (x - x.mean()) / (x.std(unbiased=True) + eps)
    w = weights.to(x.dtype)
    total = w.sum()
    if total < 2:
        return torch.zeros_like(x)
    mean = (w * x).sum() / total
    var = (w * (x - mean) ** 2).sum() / (total - 1)
    return (x - mean) / (var.sqrt() + eps)

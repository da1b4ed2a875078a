"""ARRoL (docs/algorithms.md, online pruning): prune an over-provisioned group as it is
generated, keeping the members that make the surviving group most informative, as judged by
a small quality head trained online on the policy's hidden states.

Owns the head's training step (`head_step`: mean binary cross-entropy against "the finished
sample was a success", on features detached from the policy, so the head never moves it) and
the position a finished sample is predicted at (`features_at`). The rule: at the checkpoint
the engine keeps the members whose predicted successes give the group the most expected
reward variance (random cuts while the head warms up). What runs inside generation (the
head, its transport with the weights, that rule and a group's gate) is
`reroll.engine.quality`, re-exported here for the method's callers (`reroll.trainer.arrol`,
`reroll.control.pruners`). Knows nothing of engines' slots, threads or the event loop.
"""

from __future__ import annotations

import torch
from torch import Tensor, nn

from reroll.engine.quality import (
    PREFIX,
    TIE,
    GroupGate,
    QualityHead,
    balance,
    head_from_tensors,
    head_tensors,
    prefix_confidence,
    random_survivors,
    rank_draw,
    split_weights,
    survivors,
)

__all__ = ["PREFIX", "TIE", "GroupGate", "QualityHead", "balance", "features_at",
           "head_from_tensors", "head_step", "head_tensors", "prefix_confidence",
           "random_survivors", "rank_draw", "split_weights", "survivors"]


def head_step(head: QualityHead, opt: torch.optim.Optimizer, h: Tensor, k: Tensor,
              lp: Tensor, y: Tensor) -> dict[str, float]:
    """One step of mean BCE on (h [N, H], k [N], lp [N, 2], y [N] in {0, 1}); returns the
    head's accuracy (p >= 1/2 vs y), Brier score mean (p - y)^2 and BCE on these samples
    before the step, and the BCE after it."""
    logits = head(h.detach(), k, lp)
    y = y.to(logits.device, torch.float32)
    loss = nn.functional.binary_cross_entropy_with_logits(logits, y)
    p = torch.sigmoid(logits.detach())
    out = {"arrol/head_accuracy": float(((p >= 0.5).float() == y).float().mean()),
           "arrol/head_brier": float(((p - y) ** 2).mean()),
           "arrol/head_bce": float(loss.detach())}
    opt.zero_grad(set_to_none=True)
    loss.backward()
    opt.step()
    with torch.no_grad():
        after = nn.functional.binary_cross_entropy_with_logits(head(h, k, lp), y)
    out["arrol/head_bce_after"] = float(after)
    return out


def features_at(response_len: int, at: int) -> int:
    """Position k of a finished sample's prediction: min(at, L - 1)."""
    return max(0, min(at, response_len - 1))

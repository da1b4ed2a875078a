"""Per-token advantages of a batch: each sample's scalar broadcast over its tokens, except in
tree groups whose recorded credit gives per-token advantages.

Owns the step from per-sample advantages [N] to the per-token advantages and loss mask
[N, T] the objective takes. A tree group (`reroll.workflows.tree`) records on every member
``control["tree"] = {"parent": member or None, "credit": ..., "shared": inherited tokens}``
(plus ``"scale"`` for a scaled credit); the credit named there
(`reroll.algo.tree_credit.TREE_CREDITS`) either leaves the rows alone ("leaves") or gives
per-token advantages and loss weights in place of the estimator's scalar (TreeRL's
"segments" and "segments_once"), and then a member's tokens it did not sample leave its loss
(each token is trained once, in the member that sampled it) and the ones it did are weighted
in the loss mask (with "segments", by the number of root-to-leaf paths through the token, so
the loss is TreeRL's per-path loss: `reroll.methods.treerl`). Everything comes
from the records, so a resumed run and `reroll replay` compute the same advantages; nothing
is stored. Every other row is the scalar broadcast, bitwise as before.

The metrics say what the trees cost and save: ``tree/tokens_held`` (policy tokens in the
tree groups' sequences, inherited ones once per member that holds them),
``tree/tokens_trained`` (positions in the loss, each counted once whatever its weight) and
``tree/trained_share`` (their ratio: 1 with leaf credit, the generated share with segment
credit). ``train/tokens`` (the loss mask's sum) counts a path-weighted token once per path. With per-token credit in the batch a
member's entry of the per-sample advantages (``adv/mean``, ``adv/abs_mean``) is the
mean of its tokens' advantages (0 when it trains none). Knows nothing of models or losses.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch

from reroll.algo.tree_credit import TREE_CREDITS
from reroll.rollout import Group


def tree_credit_of(g: Group) -> dict | None:
    """The group's tree credit (``{"credit", "scale"}``), or None for a group that is not a
    tree; members that disagree are an error naming the group."""
    recs = [r.control.get("tree") for r in g.rollouts]
    if all(t is None for t in recs):
        return None
    kinds = {(t or {}).get("credit") for t in recs}
    if None in kinds or len(kinds) != 1:
        raise ValueError(f"group {g.group_id}: its members record different tree credits "
                         f"{sorted(map(str, kinds))}; a tree group is all of one kind")
    return {"credit": kinds.pop(), "scale": bool(recs[0].get("scale", True))}


def tree_rows(g: Group, rewards: list[float], rec: dict
              ) -> tuple[torch.Tensor, torch.Tensor] | None:
    """(advantages [n, L-1], loss weights [n, L-1], 0 where untrained) of a tree group whose credit ``rec`` (from
    `tree_credit_of`) is per-token, with its members' ``rewards``, aligned as a batch is
    (column t predicts token t + 1), L its longest member; None for a credit that keeps the
    scalar broadcast."""
    rs = g.rollouts
    tree = [r.control["tree"] for r in rs]
    out = TREE_CREDITS.get(rec["credit"])([t["parent"] for t in tree],
                                          [t["shared"] for t in tree],
                                          [len(r.tokens) for r in rs], rewards,
                                          rs[0].prompt_len, rec["scale"])  # [n, L], [n, L]
    return None if out is None else (out[0][:, 1:], out[1][:, 1:])


def token_advantages(groups: Sequence[Group], rewards: torch.Tensor, adv: torch.Tensor,
                     mask: torch.Tensor
                     ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, dict[str, float]]:
    """(advantages [N, T], mask [N, T], per-sample advantages [N], metrics) from the rewards
    the estimator saw ``rewards`` [N] (the records' rewards, less a KL penalty when it is in
    the reward), its advantages ``adv`` [N] and the loss mask ``mask`` [N, T] of the batch of
    ``groups`` (rows in group order, as `reroll.trainer.batch.flatten` lays them out)."""
    adv_tok = adv.to(mask.device)[:, None].expand_as(mask).contiguous()  # [N, T]
    held = trained = 0.0
    row, seg = 0, False
    for g in groups:
        n, rec = len(g.rollouts), tree_credit_of(g)
        rows = None
        if rec is not None:
            held += float(mask[row:row + n].sum())
            rows = tree_rows(g, rewards[row:row + n].tolist(), rec)
        if rows is not None:
            if not seg:  # copies only when a row changes: other batches are left as they were
                adv_tok, mask, adv = adv_tok.clone(), mask.clone(), adv.clone()
                seg = True
            a, own = rows  # [n, l], [n, l]
            width = a.shape[1]
            keep = mask[row:row + n, :width] * own.to(mask.device, mask.dtype)  # [n, l]
            mask[row:row + n] = 0.0
            mask[row:row + n, :width] = keep
            adv_tok[row:row + n] = 0.0
            adv_tok[row:row + n, :width] = a.to(adv_tok.device, adv_tok.dtype) * (keep > 0)
            counts = (keep > 0).to(keep.dtype).sum(-1).cpu()  # [n] trained positions, any weight
            adv[row:row + n] = (adv_tok[row:row + n].sum(-1).cpu().to(adv.dtype)
                                / counts.clamp(min=1.0).to(adv.dtype))
        if rec is not None:
            trained += float((mask[row:row + n] > 0).sum())
        row += n
    metrics = {}
    if held > 0:
        metrics = {"tree/tokens_held": held, "tree/tokens_trained": trained,
                   "tree/trained_share": trained / held}
    return adv_tok, mask, adv, metrics

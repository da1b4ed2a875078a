"""The tree group's "entropy" mode (``rollout.tree_branch = "entropy"``; LATR, ALGORITHMS.md
3.12): branches fork where the policy hesitates between two likely tokens, not at fixed
positions.

Shape: with ``w = rollout.tree_width``, member ``i`` of a group belongs to tree ``i // w``;
the tree's first member is its root, sampled from the prompt, and the other ``w - 1`` are
its spares (a group of n: ceil(n / w) trees, the last one smaller when w does not divide
n). Every member carries a `reroll.rollout.BranchRule` (``tree_tau_abs``, ``tree_tau_rel``)
and the engine (`TorchEngine.branch`, `reroll.engine.branch`) grows the tree: where the rule
fires on any member, the tree's next spare branches off with the alternative token (span
``"forced"``); spares the tree did not use are sampled as independent requests. The group
therefore has exactly n members whatever the rule does.

Records: ``control["tree"] = {"mode": "entropy", "role", "parent", "at", "credit", "shared"}``
(plus ``"scale"`` with segment credit), ``credit`` = ``rollout.tree_credit``: ``role`` is "root", "branch" (spawned by the rule: ``parent`` is the
member index it branched from, ``at`` the response position of its forced token) or "spare"
(sampled independently: the rule never reached it); ``shared`` the tokens it inherited.

A group restored from a checkpoint (asynchronous training) with a tree already under way
does not re-attach its spares: members with tokens continue as their own requests (they do
not branch again) and unused spares are sampled independently. A tree not yet started (no
member has a token) starts afresh, as it would have. Knows nothing of the engine's caches or
of advantages: the record's ``parent`` and ``shared`` are all that segment credit
(`reroll.trainer.credit`) needs, as in the "positions" mode (a branch's forced token is its
own first token, so it is trained in the branch, never in its parent).
"""

from __future__ import annotations

import asyncio

from reroll.rollout import BranchRule, Group, Rollout
from reroll.workflows.base import EpisodeContext, in_rounds


def unstarted(r: Rollout) -> bool:
    """Nothing generated yet: no response token, not a child, not finished."""
    return r.response_len == 0 and r.parent_id is None and not r.finished


def tree_record(r: Rollout, width: int, index_of: dict[str, int], credit: str = "leaves",
                scale: bool = True) -> dict:
    """``control["tree"]`` of a finished member (see the module docstring)."""
    parent = index_of.get(r.parent_id) if r.parent_id is not None else None
    role = "root" if r.index_in_group % width == 0 else "spare" if parent is None else "branch"
    rec = {"mode": "entropy", "role": role, "parent": parent,
           "at": None if parent is None else r.prefix_len - r.prompt_len,
           "credit": credit, "shared": r.prefix_len}
    if credit == "segments":
        rec["scale"] = scale
    return rec


async def entropy_trees(ctx: EpisodeContext, group: Group) -> None:
    """Generate every unfinished member (a fresh tree through ``engine.branch``, anything
    else through ``engine.generate``), record and score each as it finishes; in rounds when
    the allocator grows groups (a new block of ``w`` members is a new tree; members added to
    a started tree are sampled independently)."""
    w = ctx.tree_width
    rule = BranchRule(tau_abs=ctx.tree_tau_abs, tau_rel=ctx.tree_tau_rel)

    async def done(r: Rollout, fut) -> None:
        if fut is not None:
            await fut
        if fut is not None or "tree" not in r.control:  # a member that finished just before a
            # checkpoint's snapshot was restored finished but unrecorded: its record is derived
            r.control["tree"] = tree_record(r, w, {m.sample_id: m.index_in_group
                                                   for m in group.rollouts},
                                            ctx.tree_credit, ctx.tree_credit_scale)
        if r.reward is None and not r.failed:
            await ctx.score(r, group.example)

    async def one(r: Rollout) -> None:
        i = r.index_in_group
        if i % w:  # its tree's root runs it
            return
        block = group.rollouts[i:i + w]
        if all(unstarted(m) for m in block):
            for m in block:
                m.sampling.branch_rule = rule
            futs = ctx.engine.branch(block[0], block[1:])
        else:
            futs = [None if m.finished else ctx.engine.generate(m) for m in block]
        await asyncio.gather(*(done(m, f) for m, f in zip(block, futs, strict=True)))

    await in_rounds(ctx, group, one)

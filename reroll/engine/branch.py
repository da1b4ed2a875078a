"""Branching at high-probability alternatives (LATR): the rule's decision
and the bookkeeping of the trees it grows.

Owns the decision of `reroll.rollout.BranchRule` as a pure tensor function (`branch_tokens`)
and the table of live trees with their spare members (`TreeTable`). Knows nothing of caches,
slots or the model: `reroll.engine.plugins.branches` (the engine's plug-in) calls the
rule at every sampled token of a request that carries one, and turns a decision into a child
with a copy of the parent's cache rows.

A tree is a root request handed to the engine with a list of spare members (unstarted
rollouts of the root's prompt). When the rule fires at position ``t`` of any member of the
tree, the next spare becomes a child: it inherits the member's first ``t`` tokens (spans
``inherited``, `reroll.engine.fork.inherit`), takes the alternative token as its token ``t``
(span ``forced``, with its log-prob under the distribution the member sampled from) and
samples on from its own seed; it is a member of the tree too. Under LATR's rule (the
`BranchRule`'s ``parent = "argmax"``) the member itself takes the most likely token at
``t`` (span ``forced`` where it had sampled another) and the child the second. When no member of a tree is in
the engine any more, its unused spares are sampled as independent requests.

The table also holds the lookahead windows each child still has to pass (LATR's pruning,
`reroll.engine.branch_prune`): a pruned child leaves the tree's members and goes back to
the front of its spares, its record reset to its prompt (`unstart`).
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass, field

import torch
from torch import Tensor

from reroll.rollout import Rollout, Span


def branch_tokens(
    logp: Tensor,  # [B, V] log-probs of the distribution each row sampled from
    sampled: Tensor,  # [B] int64: the token each row sampled
    tau_abs: Tensor,  # [B] float
    tau_rel: Tensor,  # [B] float
    argmax: Tensor | None = None,  # [B] bool: the row's rule has parent "argmax"
) -> tuple[Tensor, Tensor]:
    """([B] int64 the token a child takes at this position, -1 where the rule does not
    fire; [B] int64 the token the row itself takes there).

    With ``top`` and ``j`` the two most likely tokens (``p_top >= p_j``; equal probabilities
    in the order `torch.topk` gives), the rule fires when ``p_j > tau_abs`` and ``p_top - p_j
    < tau_rel``. Where it fires on an ``argmax`` row the row takes ``top`` and the child
    ``j`` (LATR); on any other row the row keeps ``sampled`` and the child takes ``top``
    when the row sampled ``j``, else ``j`` (also when the row sampled neither). Where it
    does not fire the row keeps ``sampled``."""
    p, idx = logp.exp().topk(2, dim=-1)  # [B, 2] each, most likely first
    fire = (p[:, 1] > tau_abs) & (p[:, 0] - p[:, 1] < tau_rel)
    other = torch.where(sampled == idx[:, 1], idx[:, 0], idx[:, 1])
    own = sampled
    if argmax is not None:
        other = torch.where(argmax, idx[:, 1], other)
        own = torch.where(fire & argmax, idx[:, 0], sampled)
    return torch.where(fire, other, torch.full_like(other, -1)), own


def unstart(r: Rollout) -> None:
    """Reset ``r``'s record to its prompt: no response, no parent (a pruned branch, a
    spare again)."""
    p = r.prompt_len
    del r.tokens[p:], r.loss_mask[p:], r.logprobs[p:], r.versions[p:]
    r.spans = [Span(0, p, "prompt")] if p else []
    r.parent_id, r.prefix_len, r.finish, r.completion = None, 0, "running", ""


@dataclass
class Watch:
    """A child's lookahead windows still to check: its parent's record, its branch point
    ``at`` (the position of its forced token), the window lengths left (ascending) and the
    `BranchRule` whose tests decide."""

    parent: Rollout
    at: int
    left: list[int]
    rule: object


@dataclass
class _Tree:
    spares: deque[Rollout]  # not yet spawned, in the order children take them
    live: set[str] = field(default_factory=set)  # members in the engine (or interrupted)
    rank: dict[str, int] = field(default_factory=dict)  # member -> 0 (root), 1, 2, ... by spawn


class TreeTable:
    """The live trees, by member sample id. A member stays live until it finishes or is
    aborted for good (an interrupt for new weights keeps it: it comes back as a resume and
    goes on branching from the same spares)."""

    def __init__(self) -> None:
        self.tree_of: dict[str, _Tree] = {}
        self.watch: dict[str, Watch] = {}  # child sample id -> its windows left

    def __bool__(self) -> bool:
        return bool(self.tree_of)

    def plant(self, root: Rollout, spares: list[Rollout]) -> None:
        """A tree of ``root`` whose children take ``spares`` in order."""
        self.tree_of[root.sample_id] = _Tree(deque(spares), {root.sample_id},
                                             {root.sample_id: 0})

    def rank(self, member_id: str) -> int:
        """The member's place in its tree (root 0, then children in the order they were
        spawned): the order in which rows that fire in one step take the tree's spares, so
        a tree's shape does not depend on the slots its members happen to occupy."""
        t = self.tree_of.get(member_id)
        return -1 if t is None else t.rank.get(member_id, -1)

    def can_spawn(self, member_id: str) -> bool:
        t = self.tree_of.get(member_id)
        return t is not None and bool(t.spares)

    def spawn(self, member_id: str) -> Rollout | None:
        """The next spare of ``member_id``'s tree, now a live member; None when none is left."""
        t = self.tree_of.get(member_id)
        if t is None or not t.spares:
            return None
        child = t.spares.popleft()
        t.live.add(child.sample_id)
        t.rank[child.sample_id] = max(t.rank.values(), default=-1) + 1
        self.tree_of[child.sample_id] = t
        return child

    def held(self) -> set[str]:
        """Sample ids of the spares not yet spawned."""
        trees = {id(t): t for t in self.tree_of.values()}.values()
        return {c.sample_id for t in trees for c in t.spares}

    def end(self, sample_ids) -> list[Rollout]:
        """Members that finished or stopped for good (other ids are ignored); returns the
        spares of the trees left with no live member, to sample independently."""
        out: list[Rollout] = []
        for i in sample_ids:
            self.watch.pop(i, None)
            t = self.tree_of.pop(i, None)
            if t is None:
                continue
            t.live.discard(i)
            if not t.live:
                out += t.spares
                t.spares.clear()
        return out

    def drop(self, sample_ids: set[str]) -> tuple[list[Rollout], list[Rollout]]:
        """Stop the named members and spares for good: (the named spares, removed; the
        spares of trees left with no live member, to sample independently)."""
        named: list[Rollout] = []
        for t in {id(t): t for t in self.tree_of.values()}.values():
            named += [c for c in t.spares if c.sample_id in sample_ids]
            t.spares = deque(c for c in t.spares if c.sample_id not in sample_ids)
        return named, self.end([i for i in sample_ids if i in self.tree_of])

    def prune(self, child: Rollout) -> list[Rollout]:
        """``child`` (a live member, not a root) is pruned: it leaves its tree's members and
        goes back to the front of its spares, its record reset (`unstart`), and its own
        children's windows against it are dropped. Returns the tree's spares when no member
        is left in the engine (to sample independently)."""
        i = child.sample_id
        t = self.tree_of.pop(i)
        self.watch.pop(i, None)
        for k in [k for k, w in self.watch.items() if w.parent is child]:
            del self.watch[k]
        t.live.discard(i)
        t.rank.pop(i, None)
        unstart(child)
        t.spares.appendleft(child)
        if t.live:
            return []
        out = list(t.spares)
        t.spares.clear()
        return out

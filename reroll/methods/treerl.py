"""TreeRL: segment credit for a tree group (``rollout.tree_credit = "segments"``).

The paper (Hou et al. 2025, "TreeRL: LLM Reinforcement Learning with On-Policy Tree
Search"). Rule in one line: every node's value is the mean reward of the leaves below it;
each token gets (V(node) - V(root)) + (V(node) - V(parent)), divided by sqrt(leaves below
the node), and every root-to-leaf path is trained as its own sequence, so a token of a node
shared by n leaves is in the loss n times. The reference code builds one training
sequence per selected leaf path and gives each of its tokens the reward of the node that
holds it; we do not name a file or function of it we could not check, and this module is
our own code.

``"segments"`` is that rule, computed without the copies: each token is trained once, in
the member that sampled it, with its node's advantage and a loss weight equal to the number
of leaves below the node (the paths through it). Per token the surrogate, a token-level
correction and a KL term depend only on the token and its prefix, which every path through
the node shares, so n copies of the token's loss are n times one copy; the loss mask carries
the weight, so a token-mean's denominator counts path tokens as the reference's batch does.
The gradient is the per-path loss's (tested against an explicit per-path loss on a tiny
model). It differs only under a sequence-level correction, which weighs each member's
sampled tokens by its own ratio where a path would use the whole path's.

Where reroll differs, and its variant: ``"segments_once"`` trains each token once with
weight 1 (its node's advantage still divided by sqrt(leaves) when ``scale``), so a node
shared by n leaves weighs n times less than in the paper; it is reroll's cheaper-to-read
variant, kept under its own name. For both: the trees are whatever the tree workflow grew
(fixed fork positions or LATR's entropy rule, `reroll.methods.latr`), read back from the
records, including members that stopped before a fork; the credit replaces the estimator's
advantage for tree groups only; ``rollout.tree_credit_scale = false`` drops the
1/sqrt(leaves) reweighting.

Owns the segments of a tree group (which tokens of which member form which node of the
trees), their advantages and weights, what the rest of the config must be for them
(`check_segments`), and the ``"segments"`` and ``"segments_once"`` entries of
`reroll.algo.tree_credit.TREE_CREDITS`. Must not know about rollouts, engines, batches or
configs beyond that check: the trainer reads the structure from the records
(`reroll.trainer.credit`).

The structure. A group of n members grows as trees (`reroll.workflows.tree`): member ``i``
is a root (``parents[i] = None``, sampled from the prompt) or forked from member
``parents[i]``, whose first ``shared[i]`` tokens (prompt included) it inherited; it sampled
every token from ``shared[i]`` (a root: from the prompt's end) to its length. A token of a
member is held by that member and by every member that inherited it, directly or through
other forks. A *node* is a set of members holding one token together: the leaves below it.
Cut each member's sampled tokens where that set changes (where one of its descendants
stopped inheriting): each piece is one *segment*, sampled by one member and held by the
node's leaves. The node above a segment (its parent) is the node of the token before it;
the node above a tree's first segment, or a segment that follows the prompt, is the group
root, the set of all n members.

With fork positions ``d_1 < ... < d_m`` and width ``w`` the nodes are the digit prefixes of
`reroll.methods.latr` (the node of the first k digits holds response tokens ``[d_k,
d_{k+1})``, ``d_0 = 0``, ``d_{m+1}`` = the end). Where a prefix holds no token the nodes are
where the sequences really part: a member that stopped (EOS) before a fork position gives
children that forked at its last token and drew it again (`reroll.engine.fork`), so they
part from it there, one level up; a fork at response position 0 shares only the prompt, so
its branches hang from the group root; a partial tree's chain of single children is one
node.

The credit. ``V(s)`` = the mean reward of the leaves of node ``s``, ``V(root)`` = the group
mean. Every token of the segment of node ``s`` gets

    A = (V(s) - V(root)) + (V(s) - V(parent(s)))        (global + local credit)

times ``1 / sqrt(|leaves(s)|)`` when ``scale`` (TreeRL's reweighting, so that a node shared
by many leaves does not dominate). Each token is trained once: in the member that sampled it,
never in the members that inherited it, with loss weight ``|leaves(s)|`` (``"segments"``:
the paths through it) or 1 (``"segments_once"``). A leaf's own last segment (``|leaves| = 1``, its
parent the node it parted from) gets ``(R_i - V(root)) + (R_i - V(parent))``.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

import torch
from torch import Tensor

from reroll.algo.tree_credit import TREE_CREDITS
from reroll.errors import ConfigError


@dataclass(frozen=True)
class Segment:
    """Tokens ``[start, end)`` (positions in the sequence, prompt included) that ``member``
    sampled and that the members in ``leaves`` hold; ``parent`` is the node above."""

    member: int
    start: int
    end: int
    leaves: frozenset[int]
    parent: frozenset[int]


def check_forest(parents: Sequence[int | None], shared: Sequence[int], lengths: Sequence[int],
               prompt_len: int) -> None:
    """A ValueError naming the member when the structure is not a forest of forks."""
    n = len(parents)
    if not (len(shared) == len(lengths) == n) or n == 0:
        raise ValueError(f"tree credit: parents, shared and lengths must be n >= 1 long, got "
                         f"{len(parents)}, {len(shared)}, {len(lengths)}")
    for i, p in enumerate(parents):
        if lengths[i] < prompt_len:
            raise ValueError(f"tree credit: member {i} is {lengths[i]} tokens, shorter than "
                             f"the prompt ({prompt_len})")
        if p is None:
            continue
        if not 0 <= p < n or p == i:
            raise ValueError(f"tree credit: member {i} has parent {p} (group of {n})")
        if not prompt_len <= shared[i] <= min(lengths[i], lengths[p]):
            raise ValueError(f"tree credit: member {i} inherits {shared[i]} tokens of member "
                             f"{p} ({lengths[p]} tokens, prompt {prompt_len}, own length "
                             f"{lengths[i]})")
        seen, j = {i}, p
        while j is not None:
            if j in seen:
                raise ValueError(f"tree credit: member {i}'s parents form a cycle")
            seen.add(j)
            j = parents[j]


def tree_segments(parents: Sequence[int | None], shared: Sequence[int],
                  lengths: Sequence[int], prompt_len: int) -> list[Segment]:
    """Every segment of the group (see the module docstring), member by member, in order."""
    check_forest(parents, shared, lengths, prompt_len)
    n = len(parents)
    kids: list[list[int]] = [[] for _ in range(n)]
    for i, p in enumerate(parents):
        if p is not None:
            kids[p].append(i)

    def start(i: int) -> int:
        return prompt_len if parents[i] is None else shared[i]

    def reach(j: int) -> list[tuple[int, int]]:
        """(member, tokens of j it holds) for every descendant of j."""
        out, todo = [], [(c, shared[c]) for c in kids[j]]
        while todo:
            k, r = todo.pop()
            out.append((k, r))
            todo += [(c, min(r, shared[c])) for c in kids[k]]
        return out

    root = frozenset(range(n))
    by_member: list[list[Segment]] = [[] for _ in range(n)]
    order = sorted(range(n), key=start)  # a parent node is always cut before its children
    for j in order:
        lo, hi = start(j), lengths[j]
        below = reach(j)
        cuts = [lo] + sorted({r for _, r in below if lo < r < hi}) + [hi]
        parent = root if lo <= prompt_len else _node_at(by_member, parents, shared, j, lo - 1)
        for a, b in zip(cuts, cuts[1:]):
            if a >= b:
                continue
            leaves = frozenset([j] + [k for k, r in below if r > a])
            by_member[j].append(Segment(j, a, b, leaves, parent))
            parent = leaves
    return [s for segs in by_member for s in segs]


def _node_at(by_member: list[list[Segment]], parents: Sequence[int | None],
             shared: Sequence[int], j: int, t: int) -> frozenset[int]:
    """The leaves of token t of member j's parent (a token j inherited)."""
    i = parents[j]
    while parents[i] is not None and t < shared[i]:  # inherited by i too: go up
        i = parents[i]
    return next(s.leaves for s in by_member[i] if s.start <= t < s.end)


def segment_advantages(segments: Sequence[Segment], rewards: Sequence[float],
                       scale: bool = True) -> list[float]:
    """A of each segment: (V(s) - V(root)) + (V(s) - V(parent)), / sqrt(|leaves|) if
    ``scale``; V the mean reward of a node's leaves, rewards [n] one per member."""
    if any(r is None or not math.isfinite(r) for r in rewards):
        raise ValueError(f"tree credit: every member needs a finite reward (a failed or "
                         f"unscored group is dropped before training), got {list(rewards)}")

    def v(node: frozenset[int]) -> float:
        return math.fsum(rewards[i] for i in node) / len(node)

    v_root = math.fsum(rewards) / len(rewards)
    out = []
    for s in segments:
        a = (v(s.leaves) - v_root) + (v(s.leaves) - v(s.parent))
        out.append(a / math.sqrt(len(s.leaves)) if scale else a)
    return out


def segment_credit(parents: Sequence[int | None], shared: Sequence[int],
                   lengths: Sequence[int], rewards: Sequence[float], prompt_len: int,
                   scale: bool = True, per_path: bool = True) -> tuple[Tensor, Tensor]:
    """Per-token segment credit of a tree group: (advantages [n, L] float32, weights [n, L]
    float32), L the longest member, position t = token t of the member's sequence. A token
    has an advantage and a weight only in the member that sampled it: the number of leaves
    below its node (``per_path``: TreeRL's one training sequence per root-to-leaf path) or 1
    (reroll's each-token-once variant). Prompt, inherited and padding positions are 0."""
    segs = tree_segments(parents, shared, lengths, prompt_len)
    advs = segment_advantages(segs, rewards, scale)
    n, width = len(parents), max(lengths)
    adv = torch.zeros(n, width, dtype=torch.float64)  # [n, L]
    weight = torch.zeros(n, width, dtype=torch.float32)  # [n, L]
    for s, a in zip(segs, advs):
        adv[s.member, s.start:s.end] = a
        weight[s.member, s.start:s.end] = float(len(s.leaves)) if per_path else 1.0
    return adv.to(torch.float32), weight


def segment_credit_once(parents: Sequence[int | None], shared: Sequence[int],
                        lengths: Sequence[int], rewards: Sequence[float], prompt_len: int,
                        scale: bool = True) -> tuple[Tensor, Tensor]:
    """reroll's variant (``"segments_once"``): `segment_credit` with every sampled token's
    weight 1, so a shared node counts once, not once per path through it."""
    return segment_credit(parents, shared, lengths, rewards, prompt_len, scale, per_path=False)


def check_segments(cfg) -> None:
    """What segment credit replaces or cannot go with is refused, naming the keys."""
    from reroll.algo import SURROGATES

    a = cfg.algo
    default = type(a)().advantage  # the [algo] table's default
    if a.advantage != default:
        raise ConfigError(f"rollout.tree_credit = \"segments\" gives tree groups TreeRL's "
                          f"segment advantages in place of algo.advantage, so algo.advantage "
                          f"= {a.advantage!r} would not be used; leave it at {default!r} or "
                          f"use rollout.tree_credit = \"leaves\"")
    if a.advantage_args:
        raise ConfigError(f"rollout.tree_credit = \"segments\" gives tree groups TreeRL's "
                          f"segment advantages, so algo.advantage_args = {a.advantage_args!r} "
                          f"would not be used (a preset such as dr_grpo sets them); drop them "
                          f"or use rollout.tree_credit = \"leaves\"")
    if a.aggregation == "seq_mean_token_mean":
        raise ConfigError("algo.aggregation = \"seq_mean_token_mean\" averages each member "
                          "over the tokens it trains, so under rollout.tree_credit = "
                          "\"segments\" a branch that owns one token gives it a whole "
                          "sequence's weight; use token_mean, seq_mean_token_sum or "
                          "seq_mean_token_sum_norm (every token weighed alike)")
    if SURROGATES.trait(a.surrogate, "sequence_advantage", False):
        raise ConfigError(f"algo.surrogate = {a.surrogate!r} trains one advantage per "
                          f"sequence, which would average away rollout.tree_credit = "
                          f"\"segments\"'s per-token credit; use gspo_token (GSPO's sequence "
                          f"ratio with per-token advantages), ppo_clip or reinforce")
    if cfg.replay.reuse:
        raise ConfigError("replay.reuse puts a banked answer in place of a group member, "
                          "which is not part of the group's trees, so rollout.tree_credit = "
                          "\"segments\" cannot credit it; turn one of them off")


TREE_CREDITS.register("segments", scaled=True, check=check_segments)(segment_credit)
TREE_CREDITS.register("segments_once", scaled=True, check=check_segments)(segment_credit_once)

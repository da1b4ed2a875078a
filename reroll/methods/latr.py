"""LATR (Xing et al. 2025, "Lookahead Tree-Based Rollouts for Enhanced Trajectory-Level
Exploration in Reinforcement Learning with Verifiable Rewards"): tree rollouts. Rule in one
line: where the policy hesitates between two likely tokens (``p_j > tau_abs`` and ``p_top -
p_j < tau_rel``) the sample takes the most likely token and a new branch the alternative,
and the leaves are trained as independent samples.

The n samples of a prompt grow as trees: a branch forks from a running sample, inherits its
prefix and continues on its own, so a group costs fewer generated tokens than n independent
samples. The paper also mixes tree and plain sampling, the share of trees decaying over
training (``rollout.tree_mix_steps``: a linear decay from 1 to 0 over that many policy
versions; the paper's exact schedule is assumed linear here). Where reroll differs:
``rollout.tree_parent = "sampled"`` keeps the member's sampled token at a branch point (the
branch takes the other candidate); LATR's lookahead pruning is built in the engine
(``rollout.tree_prune_*``, `reroll.engine.branch_prune`): a branch whose first 20, 30 or
50 tokens are too like its parent's there is dropped and its member becomes a spare again,
as the reference frees the branch's place; the reference's check that the parent's token at
the branch point is not a math symbol is not built; besides the entropy rule reroll offers fixed fork
positions, and a tree group can instead be trained with TreeRL's segment credit
(`reroll.methods.treerl`). Tokens chosen rather than sampled (span ``"forced"``: the
member's top token where it had sampled another, the branch's alternative) are recorded
with their log-prob under the distribution the member sampled from and trained like sampled
tokens; the importance correction sees a ratio of 1 for them at staleness 0 and does not
undo the choice, as LATR trains its leaves as independent samples.

Owns the two entries of `reroll.workflows.tree.TREE_BRANCHES` (``rollout.tree_branch``) and
their config checks. Knows nothing of the engine's caches or of advantages: every member's
record (`TreeOptions.record`) gives its ``parent`` and ``shared`` (tokens inherited), all
that a credit needs.

**"positions"** (`positions_trees`). With positions ``d_1 < ... < d_m`` and width ``w``,
member ``i`` of the group is leaf ``i mod w^m`` of tree ``i // w^m``; write that leaf number
in base ``w`` with ``m`` digits (the first for ``d_1``). A leaf whose digits are all 0 is the
tree's root, sampled from the prompt; any other leaf forks, at response position ``d_k`` of
its deepest non-zero digit ``k``, from the leaf with that digit set to 0. For ``w = 2``,
``d = (2, 4)``: leaf 1 forks from 0 at 4, leaf 2 from 0 at 2, leaf 3 from 2 at 4. A later
round of a grown group forks from finished parents (those children re-prefill the prefix).

**"entropy"** (`entropy_trees`). Member ``i`` belongs to tree ``i // w``; the tree's first
member is its root, sampled from the prompt, and the other ``w - 1`` are its spares (a group
of n: ceil(n / w) trees, the last one smaller when w does not divide n). Every member
carries a `reroll.rollout.BranchRule` (``tree_tau_abs``, ``tree_tau_rel``) and the engine
(`TorchEngine.branch`, `reroll.engine.branch`) grows the tree: where the rule fires on any
member, the tree's next spare branches off with the alternative token (span ``"forced"``);
spares the tree did not use are sampled as independent requests, so the group has exactly n
members whatever the rule does. With ``tree_mix_steps`` > 0 a block of ``w`` members is grown
as a tree with probability 1 - version / tree_mix_steps (`grown`); otherwise its members are
sampled independently (role "plain"). Its record adds ``"mode": "entropy"``, ``"role"``
("root", "branch": spawned by the rule, "spare": sampled independently, "plain": a block
not grown as a tree) and ``"at"`` (the response
position of a branch's forced token, its own first token: trained in the branch, never in
its parent). A group restored from a checkpoint with a tree already under way does not
re-attach its spares: members with tokens continue as their own requests and unused spares
are sampled independently; a tree not yet started starts afresh, as it would have.
"""

from __future__ import annotations

import asyncio
import hashlib

from reroll.errors import ConfigError
from reroll.rollout import BranchRule, Group, Rollout
from reroll.workflows.base import EpisodeContext, in_rounds
from reroll.workflows.tree import TREE_BRANCHES
from reroll.workflows.tree_options import TreeOptions


def tree_parent(i: int, branch_at: tuple[int, ...], width: int) -> tuple[int, int] | None:
    """"positions": (parent member, response position of the fork) of member ``i``; None for
    a root."""
    m = len(branch_at)
    size = width ** m
    leaf, base = i % size, i - i % size
    digits = [(leaf // width ** (m - 1 - k)) % width for k in range(m)]  # [m], d_1 first
    deepest = max((k for k in range(m) if digits[k]), default=None)
    if deepest is None:
        return None
    parent = leaf - digits[deepest] * width ** (m - 1 - deepest)
    return base + parent, branch_at[deepest]


async def positions_trees(ctx: EpisodeContext, group: Group) -> None:
    """Forks at fixed response positions (``rollout.tree_branch_at``), ``tree_width`` ways
    each. Generates every unfinished member: a root from its prompt, any other member as a
    fork of its parent (a member already forked, restored from a checkpoint, resumes from its own
    record); record and score each as it finishes; in rounds when the allocator grows
    groups."""
    opts = ctx.tree or TreeOptions()
    at, width = tuple(opts.branch_at), opts.width

    async def one(r: Rollout) -> None:
        ran = not r.finished
        if ran:
            spec = tree_parent(r.index_in_group, at, width)
            if spec is None or r.parent_id is not None:
                await ctx.engine.generate(r)
            else:
                parent = group.rollouts[spec[0]]
                (fut,) = ctx.engine.fork(parent, [r], r.prompt_len + spec[1])
                await fut
        if ran or "tree" not in r.control:  # a member that finished just before a
            # checkpoint's snapshot was restored finished but unrecorded: derive its record
            spec = tree_parent(r.index_in_group, at, width)
            r.control["tree"] = opts.record(r.prefix_len,
                                            parent=None if spec is None else spec[0])
        if r.reward is None and not r.failed:
            await ctx.score(r, group.example)

    await in_rounds(ctx, group, one)


def unstarted(r: Rollout) -> bool:
    """Nothing generated yet: no response token, not a child, not finished."""
    return r.response_len == 0 and r.parent_id is None and not r.finished


def tree_share(version: int, mix_steps: int) -> float:
    """LATR's decaying mix: the share of trees grown at policy ``version``, 1 - version /
    ``mix_steps`` clamped to [0, 1] (``mix_steps`` 0: always 1)."""
    if mix_steps <= 0:
        return 1.0
    return min(1.0, max(0.0, 1.0 - max(version, 0) / mix_steps))


def grown(group: Group, block: int, opts: TreeOptions) -> bool:
    """Whether the ``block``-th tree of ``group`` is grown as a tree: a uniform from a hash
    of (group id, block) below `tree_share` at the group's start version (the same on a
    resume)."""
    share = tree_share(group.start_version, opts.mix_steps)
    if share >= 1.0:
        return True
    h = hashlib.blake2b(f"{group.group_id}/{block}".encode(), digest_size=8).digest()
    return int.from_bytes(h, "big") / 2.0 ** 64 < share


def entropy_record(r: Rollout, opts: TreeOptions, index_of: dict[str, int],
                   tree: bool = True) -> dict:
    """``control["tree"]`` of a finished member of an "entropy" tree (``tree`` False: of a
    block sampled independently by the mix)."""
    parent = index_of.get(r.parent_id) if r.parent_id is not None else None
    role = ("plain" if not tree else "root" if r.index_in_group % opts.width == 0
            else "spare" if parent is None else "branch")
    return opts.record(r.prefix_len, mode="entropy", role=role, parent=parent,
                       at=None if parent is None else r.prefix_len - r.prompt_len)


async def entropy_trees(ctx: EpisodeContext, group: Group) -> None:
    """LATR's rule: a spare branches off where a member's top two tokens are both likely
    (``tree_tau_abs``, ``tree_tau_rel``). Generates every unfinished member (a fresh tree
    through ``engine.branch``, anything else through ``engine.generate``), record and score each as it finishes; in rounds when
    the allocator grows groups (a new block of ``w`` members is a new tree; members added to
    a started tree are sampled independently)."""
    opts = ctx.tree or TreeOptions()
    w = opts.width
    rule = BranchRule(tau_abs=opts.tau_abs, tau_rel=opts.tau_rel, parent=opts.parent,
                      prune_at=opts.prune_at, prune_edit=opts.prune_edit,
                      prune_rouge_l=opts.prune_rouge_l, prune_suffix=opts.prune_suffix)

    async def done(r: Rollout, fut, tree: bool) -> None:
        if fut is not None:
            await fut
        if fut is not None or "tree" not in r.control:  # a member that finished just before a
            # checkpoint's snapshot was restored finished but unrecorded: its record is derived
            r.control["tree"] = entropy_record(r, opts, {m.sample_id: m.index_in_group
                                                         for m in group.rollouts}, tree)
        if r.reward is None and not r.failed:
            await ctx.score(r, group.example)

    async def one(r: Rollout) -> None:
        i = r.index_in_group
        if i % w:  # its tree's root runs it
            return
        block = group.rollouts[i:i + w]
        tree = grown(group, i // w, opts)
        if tree and all(unstarted(m) for m in block):
            for m in block:
                m.sampling.branch_rule = rule
            futs = ctx.engine.branch(block[0], block[1:])
        else:
            futs = [None if m.finished else ctx.engine.generate(m) for m in block]
        await asyncio.gather(*(done(m, f, tree) for m, f in zip(block, futs, strict=True)))

    await in_rounds(ctx, group, one)


def check_positions(cfg, tau_keys: list[str]) -> None:
    """"positions": no entropy thresholds; positions strictly ascending inside the
    response."""
    r = cfg.rollout
    if tau_keys:
        raise ConfigError(f"rollout.{tau_keys[0]} is used by rollout.tree_branch = "
                          f"\"entropy\" only (it is \"positions\")")
    pts = list(r.tree_branch_at)
    if not pts or any(not isinstance(p, int) for p in pts):
        raise ConfigError(f"rollout.tree_branch_at: the tree workflow needs a list of "
                          f"response positions (ints), got {pts!r}")
    if pts != sorted(set(pts)) or pts[0] < 0 or pts[-1] >= r.max_new_tokens:
        raise ConfigError(f"rollout.tree_branch_at must be strictly ascending in [0, "
                          f"rollout.max_new_tokens = {r.max_new_tokens}), got {pts}")


def check_entropy(cfg, tau_keys: list[str]) -> None:
    """"entropy": no fixed positions, and a rule that can fire with the sampling settings."""
    r = cfg.rollout
    if r.tree_branch_at:
        raise ConfigError("rollout.tree_branch_at is used by rollout.tree_branch = "
                          "\"positions\" only (\"entropy\" branches where its rule fires)")
    windows = list(r.tree_prune_at)
    if any(isinstance(k, bool) or not isinstance(k, int) or k < 1 for k in windows):
        raise ConfigError(f"rollout.tree_prune_at: LATR's lookahead windows must be token "
                          f"counts >= 1 (or [] for no pruning), got {windows!r}")
    never = [why for why, on in (
        (f"rollout.tree_tau_abs = {r.tree_tau_abs} (the second most likely token never "
         f"has p >= 0.5)", r.tree_tau_abs >= 0.5),
        ("rollout.top_k = 1 (the second candidate is filtered out)", r.top_k == 1),
        ("rollout.temperature = 0 (greedy requests never branch)", r.temperature == 0))
        if on]
    if never:
        raise ConfigError(f"rollout.tree_branch = \"entropy\": the branching rule can never "
                          f"fire with {never[0]}, so every spare would wait for its tree and "
                          f"then run alone; use rollout.workflow = \"single_turn\" or "
                          f"change the key")


TREE_BRANCHES.register("positions", check=check_positions)(positions_trees)
TREE_BRANCHES.register("entropy", check=check_entropy)(entropy_trees)

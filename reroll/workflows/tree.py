"""The tree group (LATR-style tree rollouts, ALGORITHMS.md 3.12): the n samples of a prompt
grow as trees whose branches fork at configured response positions and share the prefix
above the fork (its cached keys/values too: `reroll.engine.fork`), so a group of n costs
fewer generated tokens than n independent samples.

Owns the shape of the trees (which member forks from which, at which position) and the
record of it: every member gets ``control["tree"] = {"parent": member or None, "credit":
rollout.tree_credit, "shared": tokens inherited}`` (plus ``"scale"`` with segment credit).
Knows nothing of the engine's caches or of advantages. How a group is trained is the
record's ``credit``: ``"leaves"`` (LATR's choice) trains the leaves as independent samples,
each keeping its inherited tokens in the loss with the parent's behaviour log-probs;
``"segments"`` (TreeRL, ALGORITHMS.md 3.15) trains each token once, in the member that
sampled it, with its node's advantage (`reroll.algo.tree_credit` says what the nodes are,
including members that stopped before a fork position; `reroll.trainer.credit` reads the
records when the step trains).

Shape: with positions ``d_1 < ... < d_m`` and width ``w``, member ``i`` of the group is leaf
``i mod w^m`` of tree ``i // w^m``; write that leaf number in base ``w`` with ``m`` digits
(the first for ``d_1``). A leaf whose digits are all 0 is the tree's root, sampled from the
prompt; any other leaf forks, at response position ``d_k`` of its deepest non-zero digit
``k``, from the leaf with that digit set to 0. For ``w = 2``, ``d = (2, 4)``: leaf 1 forks
from 0 at 4, leaf 2 from 0 at 2, leaf 3 from 2 at 4. That is ``rollout.tree_branch =
"positions"``; ``"entropy"`` (LATR's rule: branch where two tokens are both likely) is
`reroll.workflows.tree_entropy`.
"""

from __future__ import annotations

from reroll.errors import ConfigError
from reroll.rollout import Group, Rollout
from reroll.workflows.base import WORKFLOWS, EpisodeContext, in_rounds
from reroll.workflows.tree_entropy import entropy_trees


def tree_parent(i: int, branch_at: tuple[int, ...], width: int) -> tuple[int, int] | None:
    """(parent member, response position of the fork) of member ``i``; None for a root."""
    m = len(branch_at)
    size = width ** m
    leaf, base = i % size, i - i % size
    digits = [(leaf // width ** (m - 1 - k)) % width for k in range(m)]  # [m], d_1 first
    deepest = max((k for k in range(m) if digits[k]), default=None)
    if deepest is None:
        return None
    parent = leaf - digits[deepest] * width ** (m - 1 - deepest)
    return base + parent, branch_at[deepest]


@WORKFLOWS.register("tree")
async def tree(ctx: EpisodeContext, group: Group) -> None:
    """Generate every unfinished member: a root from its prompt, any other member as a fork
    of its parent (a member already forked, restored from a checkpoint, resumes from its
    own record); score each as it finishes; in rounds when the allocator grows groups (a
    later round forks from finished parents: those children re-prefill the prefix).
    ``tree_branch = "entropy"``: `entropy_trees`."""
    if ctx.tree_branch == "entropy":
        return await entropy_trees(ctx, group)
    at, width = tuple(ctx.tree_branch_at), ctx.tree_width

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
            r.control["tree"] = {"parent": None if spec is None else spec[0],
                                 "credit": ctx.tree_credit, "shared": r.prefix_len}
            if ctx.tree_credit == "segments":
                r.control["tree"]["scale"] = ctx.tree_credit_scale
        if r.reward is None and not r.failed:
            await ctx.score(r, group.example)

    await in_rounds(ctx, group, one)


CREDITS = ("leaves", "segments")


def check_tree(cfg) -> None:
    """The tree workflow's keys: the branching mode; positions ascending inside the response
    ("positions"), or no positions and the rule's thresholds left to "entropy"; width >= 2;
    the engine that forks sequences (the torch engine in this process); and a credit that the
    rest of the config can train (`check_credit`)."""
    r = cfg.rollout
    entropy_keys = [k for k, v, d in (("tree_tau_abs", r.tree_tau_abs, 0.15),
                                       ("tree_tau_rel", r.tree_tau_rel, 0.25)) if v != d]
    if r.workflow != "tree":
        used = [k for k, on in (("tree_branch_at", r.tree_branch_at),
                                ("tree_branch", r.tree_branch != "positions"),
                                ("tree_credit", r.tree_credit != "leaves"),
                                ("tree_credit_scale", not r.tree_credit_scale),
                                *((k, True) for k in entropy_keys)) if on]
        if used:
            raise ConfigError(f"rollout.{used[0]} is used by rollout.workflow = \"tree\" only "
                              f"(it is {r.workflow!r})")
        return
    check_credit(cfg)
    if r.tree_branch not in ("positions", "entropy"):
        raise ConfigError(f"rollout.tree_branch must be \"positions\" or \"entropy\", got "
                          f"{r.tree_branch!r}")
    if r.tree_branch == "entropy":
        if r.tree_branch_at:
            raise ConfigError("rollout.tree_branch_at is used by rollout.tree_branch = "
                              "\"positions\" only (\"entropy\" branches where its rule fires)")
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
    else:
        if entropy_keys:
            raise ConfigError(f"rollout.{entropy_keys[0]} is used by rollout.tree_branch = "
                              f"\"entropy\" only (it is \"positions\")")
        _check_positions(r)
    if r.tree_width < 2:
        raise ConfigError(f"rollout.tree_width must be >= 2, got {r.tree_width}")
    if cfg.engine.name != "torch" or cfg.runtime.kind != "local":
        raise ConfigError(f"rollout.workflow = \"tree\" needs the engine that forks sequences: "
                          f"engine.name = \"torch\" and runtime.kind = \"local\" (got "
                          f"{cfg.engine.name!r}, {cfg.runtime.kind!r})")


def _check_positions(r) -> None:
    pts = list(r.tree_branch_at)
    if not pts or any(not isinstance(p, int) for p in pts):
        raise ConfigError(f"rollout.tree_branch_at: the tree workflow needs a list of "
                          f"response positions (ints), got {pts!r}")
    if pts != sorted(set(pts)) or pts[0] < 0 or pts[-1] >= r.max_new_tokens:
        raise ConfigError(f"rollout.tree_branch_at must be strictly ascending in [0, "
                          f"rollout.max_new_tokens = {r.max_new_tokens}), got {pts}")


def check_credit(cfg) -> None:
    """``rollout.tree_credit``: a known one; with "segments", what its formula replaces or
    cannot go with is refused, naming the keys."""
    from reroll.algo import SURROGATES

    r, a = cfg.rollout, cfg.algo
    if r.tree_credit not in CREDITS:
        raise ConfigError(f"rollout.tree_credit must be one of {', '.join(CREDITS)}, got "
                          f"{r.tree_credit!r}")
    if r.tree_credit != "segments":
        if not r.tree_credit_scale:
            raise ConfigError("rollout.tree_credit_scale is used by rollout.tree_credit = "
                              "\"segments\" only (it is \"leaves\")")
        return
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

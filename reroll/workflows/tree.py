"""The tree workflow (``rollout.workflow = "tree"``): the n samples of a prompt grow as trees
whose branches fork inside the engine and share the prefix above each fork (its cached
keys/values too: `reroll.engine.fork`), so a group of n costs fewer generated tokens than n
independent samples.

Owns (beside its options, `reroll.workflows.tree_options.TreeOptions`) the
``TREE_BRANCHES`` registry (where members fork: ``rollout.tree_branch``; an entry is an
``async (ctx, group)`` workflow), the record every member gets, and the config check of the
keys. The branching modes are LATR's (`reroll.methods.latr`: fixed positions, or its
entropy rule); how a tree group is trained is the recorded credit
(`reroll.algo.tree_credit.TREE_CREDITS`: ``"leaves"``, or TreeRL's ``"segments"``,
`reroll.methods.treerl`). A record is ``control["tree"] = {..., "parent": member or None,
"credit": rollout.tree_credit, "shared": tokens inherited}`` (plus ``"scale"`` for a scaled
credit). Knows nothing of the engine's caches or of advantages.
"""

from __future__ import annotations

from reroll.algo.tree_credit import TREE_CREDITS
from reroll.errors import ConfigError
from reroll.registry import METHODS, Registry
from reroll.rollout import Group
from reroll.workflows.base import WORKFLOWS, EpisodeContext
from reroll.workflows.tree_options import TreeOptions

TREE_BRANCHES = Registry("tree branch", plugins=METHODS)


@WORKFLOWS.register("tree")
async def tree(ctx: EpisodeContext, group: Group) -> None:
    """Generate every unfinished member as its branching mode says (a member already forked,
    restored from a checkpoint, resumes from its own record); score each as it finishes; in
    rounds when the allocator grows groups."""
    opts = ctx.tree or TreeOptions()
    await TREE_BRANCHES.get(opts.branch)(ctx, group)


def check_tree(cfg) -> None:
    """The tree workflow's keys: none set outside it; a known credit and what it needs; a
    known branching mode and its own keys (its ``check`` trait); width >= 2; the engine that
    forks sequences (the torch engine in this process)."""
    r = cfg.rollout
    defaults = TreeOptions()
    tau_keys = [k for k, v, d in (("tree_tau_abs", r.tree_tau_abs, defaults.tau_abs),
                                   ("tree_tau_rel", r.tree_tau_rel, defaults.tau_rel),
                                   ("tree_parent", r.tree_parent, defaults.parent),
                                   ("tree_mix_steps", r.tree_mix_steps, defaults.mix_steps),
                                   ("tree_prune_at", tuple(r.tree_prune_at), defaults.prune_at),
                                   ("tree_prune_edit", r.tree_prune_edit, defaults.prune_edit),
                                   ("tree_prune_rouge_l", r.tree_prune_rouge_l,
                                    defaults.prune_rouge_l),
                                   ("tree_prune_suffix", r.tree_prune_suffix,
                                    defaults.prune_suffix))
                if v != d]  # the "entropy" mode's own keys
    if r.workflow != "tree":
        used = [k for k, on in (("tree_branch_at", r.tree_branch_at),
                                ("tree_branch", r.tree_branch != defaults.branch),
                                ("tree_credit", r.tree_credit != defaults.credit),
                                ("tree_credit_scale", not r.tree_credit_scale),
                                *((k, True) for k in tau_keys)) if on]
        if used:
            raise ConfigError(f"rollout.{used[0]} is used by rollout.workflow = \"tree\" only "
                              f"(it is {r.workflow!r})")
        return
    if r.tree_credit not in TREE_CREDITS:
        raise ConfigError(f"rollout.tree_credit must be one of "
                          f"{', '.join(TREE_CREDITS.names())}, got {r.tree_credit!r}")
    if not r.tree_credit_scale and not TREE_CREDITS.trait(r.tree_credit, "scaled", False):
        scaled = [n for n in TREE_CREDITS.names() if TREE_CREDITS.trait(n, "scaled", False)]
        raise ConfigError(f"rollout.tree_credit_scale is used by rollout.tree_credit = "
                          f"{_quoted(scaled)} only (it is \"{r.tree_credit}\")")
    check_credit = TREE_CREDITS.trait(r.tree_credit, "check")
    if check_credit is not None:
        check_credit(cfg)
    if r.tree_branch not in TREE_BRANCHES:
        names = sorted(TREE_BRANCHES.names(), key=lambda n: n != defaults.branch)
        raise ConfigError(f"rollout.tree_branch must be {_quoted(names)}, got "
                          f"{r.tree_branch!r}")
    check_branch = TREE_BRANCHES.trait(r.tree_branch, "check")
    if check_branch is not None:
        check_branch(cfg, tau_keys)
    if r.tree_width < 2:
        raise ConfigError(f"rollout.tree_width must be >= 2, got {r.tree_width}")
    if cfg.engine.name != "torch" or cfg.runtime.kind != "local":
        raise ConfigError(f"rollout.workflow = \"tree\" needs the engine that forks sequences: "
                          f"engine.name = \"torch\" and runtime.kind = \"local\" (got "
                          f"{cfg.engine.name!r}, {cfg.runtime.kind!r})")


def _quoted(names: list[str]) -> str:
    return " or ".join(f'"{n}"' for n in names)

"""Tree credit: how the members of a tree group (``rollout.workflow = "tree"``) are trained,
chosen by ``rollout.tree_credit``.

Owns the ``TREE_CREDITS`` registry and its default, ``"leaves"``. A credit is called as
``credit(parents, shared, lengths, rewards, prompt_len, scale) -> (advantages [n, L],
loss weights [n, L], 0 where not trained) | None`` from a group's records (``parents[i]``: the member that member
``i`` forked from, None for a root; ``shared[i]``: the tokens it inherited, prompt
included; ``lengths[i]``: its tokens; ``rewards[i]``); None keeps the estimator's scalar
advantage broadcast over each member's tokens. Traits: ``scaled`` (the record carries
``rollout.tree_credit_scale`` as ``"scale"``) and ``check(cfg)`` (what the rest of the
config must be for it, raising ConfigError). Other credits are methods (TreeRL's segment
credit: `reroll.methods.treerl`). Knows nothing of rollouts, engines or batches.
"""

from __future__ import annotations

from collections.abc import Sequence

from reroll.registry import METHODS, Registry

TREE_CREDITS = Registry("tree credit", plugins=METHODS)


@TREE_CREDITS.register("leaves")
def leaves(parents: Sequence[int | None], shared: Sequence[int], lengths: Sequence[int],
           rewards: Sequence[float], prompt_len: int, scale: bool = True) -> None:
    """Each leaf is trained as an independent sample (LATR's choice): its scalar advantage
    over all its response tokens, inherited ones included, with the behaviour log-probs of
    the member that sampled them."""
    return None

"""The tree workflow's options (`TreeOptions`, from the ``rollout.tree_*`` keys) and the
record each member gets. Apart from `reroll.workflows.tree` so that `EpisodeContext` can
name the type without importing the workflow (which imports it). Knows nothing of engines.
"""

from __future__ import annotations

from dataclasses import dataclass

from reroll.algo.tree_credit import TREE_CREDITS


@dataclass(frozen=True)
class TreeOptions:
    """The tree workflow's settings (the ``rollout.tree_*`` keys, `RolloutConfig`)."""

    branch: str = "positions"
    """Where members fork: a `TREE_BRANCHES` name."""
    branch_at: tuple[int, ...] = ()
    """"positions": the response positions where each branch forks."""
    width: int = 2
    """Branches at each of those positions ("entropy": members per tree)."""
    credit: str = "leaves"
    """How the groups are trained, recorded on each member (a `TREE_CREDITS` name)."""
    credit_scale: bool = True
    """A scaled credit's 1 / sqrt(leaves) factor."""
    tau_abs: float = 0.15
    """"entropy": the alternative token's least probability (`BranchRule.tau_abs`)."""
    tau_rel: float = 0.25
    """"entropy": the largest gap to the top token (`BranchRule.tau_rel`)."""
    parent: str = "argmax"
    """"entropy": who takes the top token at a branch point (`BranchRule.parent`)."""
    mix_steps: int = 0
    """"entropy": the policy version where the share of trees grown reaches 0 (0: always 1)."""
    prune_at: tuple[int, ...] = (20, 30, 50)
    """"entropy": LATR's lookahead windows (`BranchRule.prune_at`; () no pruning)."""
    prune_edit: float = 0.4
    """"entropy": prune below this edit distance / window (`BranchRule.prune_edit`)."""
    prune_rouge_l: float = 1.0
    """"entropy": prune above this ROUGE-L F1 (`BranchRule.prune_rouge_l`)."""
    prune_suffix: float = 1.0
    """"entropy": prune above this shared suffix / window (`BranchRule.prune_suffix`)."""

    @classmethod
    def from_config(cls, r) -> TreeOptions:
        """From a `RolloutConfig`."""
        return cls(branch=r.tree_branch, branch_at=tuple(r.tree_branch_at), width=r.tree_width,
                   credit=r.tree_credit, credit_scale=r.tree_credit_scale,
                   tau_abs=r.tree_tau_abs, tau_rel=r.tree_tau_rel, parent=r.tree_parent,
                   mix_steps=r.tree_mix_steps, prune_at=tuple(r.tree_prune_at),
                   prune_edit=r.tree_prune_edit, prune_rouge_l=r.tree_prune_rouge_l,
                   prune_suffix=r.tree_prune_suffix)

    def record(self, shared: int, **fields) -> dict:
        """``control["tree"]`` of a member: ``fields`` (``parent`` and the mode's own), then
        the credit, the tokens inherited and, for a scaled credit, the scale."""
        rec = {**fields, "credit": self.credit, "shared": shared}
        if TREE_CREDITS.trait(self.credit, "scaled", False):
            rec["scale"] = self.credit_scale
        return rec

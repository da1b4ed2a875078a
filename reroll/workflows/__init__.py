"""Rollout workflows: one async function per group (see `reroll.workflows.base`)."""

from reroll.workflows import multi_turn, single_turn, tree  # noqa: F401  (registers them)
from reroll.workflows.base import WORKFLOWS, EnvReward, EpisodeContext, Workflow

__all__ = ["WORKFLOWS", "EnvReward", "EpisodeContext", "Workflow"]

"""Environments for multi-turn and tool-using rollouts (see `reroll.envs.base`)."""

from reroll.envs import verifier  # noqa: F401  (registers the built-in environments)
from reroll.envs.base import ENVIRONMENTS, Environment, StepResult

__all__ = ["ENVIRONMENTS", "Environment", "StepResult"]

"""Environments for multi-turn and tool-using rollouts (see `reroll.envs.base`). Importing
this package registers the built-in ones: calculator, guess, countdown_feedback, verifier."""

from reroll.envs import calculator, countdown_feedback, guess, verifier  # noqa: F401
from reroll.envs.base import ENVIRONMENTS, Environment, StepResult

__all__ = ["ENVIRONMENTS", "Environment", "StepResult"]

"""Environments for multi-turn and tool-using rollouts (see `reroll.envs.base`)."""

from reroll.envs.base import ENVIRONMENTS, Environment, StepResult

__all__ = ["ENVIRONMENTS", "Environment", "StepResult"]

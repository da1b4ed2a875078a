"""The Environment protocol of multi-turn and tool-using rollouts, and its registry.

Owns the contract between a rollout workflow and an environment: text in, text out. The
workflow renders the policy's turn (the text it sampled) into ``step(action)``, and appends
the returned observation to the record as tokens with ``loss_mask`` False (environment tokens
never carry loss and never count toward length limits). The environment never sees tokens,
engines, trainers or threads, so it is plain Python and unit-testable on its own.

One environment instance lives for one episode (one sample of a group): ``reset(example)``
starts it, each ``step`` answers one policy turn. Rewards may come at any step (step rewards);
the episode's reward is their sum. An environment that raises is an error of that sample
(errors are data: never a silent 0).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Protocol, runtime_checkable

from reroll.registry import Registry
from reroll.rollout import Example

ENVIRONMENTS = Registry("environment")


@dataclass
class StepResult:
    """What an environment answers to one policy turn."""

    observation: str = ""
    """Text appended after the policy's turn (as environment tokens); "" for none."""
    reward: float = 0.0
    """Reward of this step; the episode's reward is the sum over its steps."""
    done: bool = False
    """True when the episode is over (the workflow then samples no further turn)."""
    info: dict[str, Any] = field(default_factory=dict)
    """Diagnostics kept in the record's score info (tool called, tool result, ...)."""


@runtime_checkable
class Environment(Protocol):
    stop_strings: list[str]
    """Strings that end a policy turn besides EOS (e.g. a tool call's closing tag)."""

    def reset(self, example: Example) -> str:
        """Start an episode for ``example``; returns text appended after the prompt before
        the first policy turn ("" for none)."""
        ...

    def step(self, action: str) -> StepResult:
        """Answer one policy turn (the text the policy sampled in that turn)."""
        ...

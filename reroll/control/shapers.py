"""Group shapers: reward terms a complete group's samples get from the group as a whole
(`reroll.methods`: DOT's outlier truncation), applied by the controller when the group
completes, before the advantage sees it.

Owns the ``SHAPERS`` registry. A shaper is built as ``cls(*, hyperparameters)`` and called as
``shaper(group, successes)``: ``successes`` holds whether each member counts correct (the
controller's ``success_at`` on the verifier value), or is None when a member has no value (a
failed verifier: no decision on errors). It changes ``Rollout.reward`` in place and records
each term under its own name in ``Rollout.shaping`` (never among the verifier scores, which
the statistics read), and must be idempotent: a group restored from a checkpoint completes
again. Which shapers a run uses is the wiring's choice (the config's own keys, e.g.
``control.dot_k``). Knows nothing of engines, the scheduler or any method.
"""

from __future__ import annotations

from typing import Protocol

from reroll.registry import METHODS, Registry
from reroll.rollout import Group

SHAPERS = Registry("group shaper", plugins=METHODS)


class Shaper(Protocol):
    def __call__(self, g: Group, successes: list[bool] | None) -> None: ...

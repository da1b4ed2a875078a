"""The task record, its error type, the task registry and small helpers shared by builders.

Owns what a task is (a train list, a test list and a default reward spec) and how a seed
turns into a deterministic, disjoint split. Must not know verifiers, models or the trainer:
a task names its default verifier by registry name only.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass

from reroll.registry import Registry
from reroll.rollout import Example

TASKS = Registry("task")


class TaskError(ValueError):
    """A task cannot be built: bad hyperparameters, or a bad data file (named with its row)."""


@dataclass
class Task:
    """Examples to train and evaluate on, and the reward spec used when the config names none.

    ``verifier`` is ``{"name": <registered verifier>, "args": {...}}``.
    """

    name: str
    train: list[Example]
    test: list[Example]
    verifier: dict


def seeded_unit(seed: int, key: str) -> float:
    """A uniform number in [0, 1) that depends only on ``seed`` and ``key`` (stable across
    processes and Python versions, unlike ``hash``)."""
    digest = hashlib.sha256(f"{seed}\x00{key}".encode()).digest()
    return int.from_bytes(digest[:8], "big") / 2.0**64


def require(ok: bool, task: str, message: str) -> None:
    """Raise a TaskError about hyperparameters of ``task`` unless ``ok``."""
    if not ok:
        raise TaskError(f"task {task!r}: {message}")

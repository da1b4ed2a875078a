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

    ``verifier`` is ``{"name": <registered verifier>, "args": {...}}``. ``answer_marker``:
    the text after which a completion states its final answer (``####``, ``\\boxed{``),
    when the task has one; DUET's marker gate stops a sample shortly after it.
    """

    name: str
    train: list[Example]
    test: list[Example]
    verifier: dict
    answer_marker: str = ""


def seeded_unit(seed: int, key: str) -> float:
    """A uniform number in [0, 1) that depends only on ``seed`` and ``key`` (stable across
    processes and Python versions, unlike ``hash``)."""
    digest = hashlib.sha256(f"{seed}\x00{key}".encode()).digest()
    return int.from_bytes(digest[:8], "big") / 2.0**64


def require(ok: bool, task: str, message: str) -> None:
    """Raise a TaskError about hyperparameters of ``task`` unless ``ok``."""
    if not ok:
        raise TaskError(f"task {task!r}: {message}")


@dataclass
class PromptFit:
    """What `check_prompt_lengths` found: examples dropped (``skip``), and prompts that fit
    but leave fewer than ``room`` positions to answer (their answers will be cut), with the
    first of them (its id, split, length)."""

    dropped: int = 0
    cut: int = 0
    first_cut: tuple[str, str, int] | None = None


def check_prompt_lengths(task: Task, encode, limit: int, *, where: str, skip: bool = False,
                         room: int = 0) -> PromptFit:
    """Every prompt must leave the engine room to sample (fewer than ``limit`` tokens). A
    longer one is a TaskError naming it (``where`` says which task or file), found when the
    data loads rather than when the row is drawn mid-run; with ``skip`` such examples are
    dropped from both splits instead, and counted. Prompts that fit but leave fewer than
    ``room`` positions (``limit - length < room``) are counted too (the caller warns once).
    Each prompt is tokenized once."""
    fit = PromptFit()
    for split in ("train", "test"):
        kept = []
        for i, ex in enumerate(getattr(task, split)):
            n = len(encode(ex.prompt))
            if n < limit:
                kept.append(ex)
                if limit - n < room:
                    fit.cut += 1
                    fit.first_cut = fit.first_cut or (ex.prompt_id, split, n)
            elif skip:
                fit.dropped += 1
            else:
                raise TaskError(f"{where}: prompt {ex.prompt_id!r} ({split} example {i}) has "
                                f"{n} tokens, but the model holds {limit} in all (its context "
                                f"length); shorten it, or set task.skip_long_prompts = true to "
                                f"skip such prompts (counted)")
        setattr(task, split, kept)
    if not task.train:
        raise TaskError(f"{where}: no train prompt fits the model's {limit}-token context")
    return fit

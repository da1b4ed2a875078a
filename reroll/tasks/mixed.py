"""The ``arith_mixed`` task: integer arithmetic at three difficulty levels, easy to hard.

A workload whose prompts differ in how often a small model solves them, so that adaptive
allocation of samples per prompt has something to adapt to. Every example carries its
level in ``fields["difficulty"]``. The levels (disjoint by construction, numbers < 100):

- ``easy``: two-operand addition with at least one single-digit operand (``37+5``, ``3+5``;
  1,900 problems),
- ``medium``: two-operand addition or subtraction of two-digit numbers (``37+45``,
  ``12-30``; 16,200 problems),
- ``hard``: three operands with ``+``/``-`` between them (``37-45+12``; 4,000,000 problems).

Answers fit in four characters (``-198`` to ``198``). Owns the levels and their mixture:
each split is apportioned among the levels by their weights (largest remainder, so the
counts are exact and the test split holds the levels in the same proportions as train).
Problem generation is ``reroll.tasks.arithmetic``'s: an index into an operand/operator space
decoded to an expression, evaluated with ``reroll.tasks.expr``. Train is shuffled; test is
interleaved level by level so that any prefix of it (``eval.n_examples``) keeps the
proportions. After ``configs/mixed.toml``'s SFT the tiny model solves about 90% of easy,
50% of medium and 2% of hard held-out prompts greedily.

With ``marker`` set (e.g. ``"#"``) completions show their work and then state the answer
after the marker, the task's ``answer_marker`` (DUET's marker gate): a three-operand problem
does its first operation, then the rest (``37-45+12=`` -> ``-8+12#4``), a two-operand one
answers at once (``37+5=`` -> ``#42``). Only the demonstrations change (prompts, answers and
the ``numeric`` reward's last number are the same); "" (the default) keeps the plain answers. Must not know tokenizers or
verifiers (the default reward is ``numeric``).
"""

from __future__ import annotations

import functools
import random
import re
import warnings
from collections.abc import Callable
from dataclasses import dataclass, replace

from reroll.rollout import Example
from reroll.tasks.arithmetic import _distinct_indices, decode, make_example, space_size
from reroll.tasks.base import TASKS, Task, TaskError, require
from reroll.tasks.expr import evaluate

_ENUMERATE_LIMIT = 100_000  # a filtered level's space is listed in full up to this size


@dataclass(frozen=True)
class Level:
    """Problems of one difficulty: ``decode(i, digits, ops, operands)`` for ``i`` in the
    arithmetic space, kept when ``keep(operands)`` holds (``None``: every one)."""

    digits: int
    ops: str
    operands: int
    keep: Callable[[list[int]], bool] | None = None

    def expression(self, index: int) -> str:
        return decode(index, self.digits, self.ops, self.operands)


def operands_of(expression: str) -> list[int]:
    return [int(n) for n in re.findall(r"\d+", expression)]


@functools.cache
def level_pool(level: Level) -> tuple[int, ...] | None:
    """The level's kept indices in increasing order (listed once per process), or None when
    it keeps every index."""
    if level.keep is None:
        return None
    space = space_size(level.digits, level.ops, level.operands)
    assert space <= _ENUMERATE_LIMIT, "a filtered level must be small enough to list"
    return tuple(i for i in range(space) if level.keep(operands_of(level.expression(i))))


LEVELS = {
    "easy": Level(digits=2, ops="+", operands=2, keep=lambda nums: min(nums) < 10),
    "medium": Level(digits=2, ops="+-", operands=2, keep=lambda nums: min(nums) >= 10),
    "hard": Level(digits=2, ops="+-", operands=3),
}


def apportion(n: int, weights: dict[str, float]) -> dict[str, int]:
    """``n`` split by ``weights`` with the largest-remainder method: each share is the floor
    of ``n * w / sum(w)``, and what is left goes one by one to the largest remainders (ties
    to the earlier level). The counts sum to ``n`` exactly."""
    total = sum(weights.values())
    quotas = {k: n * w / total for k, w in weights.items()}
    counts = {k: int(q) for k, q in quotas.items()}
    order = sorted(weights, key=lambda k: -(quotas[k] - counts[k]))  # stable: ties by order
    for k in order[: n - sum(counts.values())]:
        counts[k] += 1
    return counts


def worked(expression: str, answer: str, marker: str) -> str:
    """The demonstration with its work: the first operation of ``expression`` done, the
    rest as written, then ``marker`` and the answer (no work for two operands)."""
    m = re.fullmatch(r"(\d+[-+]\d+)([-+].*)?", expression)
    if m is None:
        raise ValueError(f"arith_mixed: cannot show the work of {expression!r}")
    work = f"{int(evaluate(m[1]))}{m[2]}" if m[2] else ""
    return f"{work}{marker}{answer}"


def mixed_example(expression: str, level: str, marker: str = "") -> Example:
    """One problem as ``arithmetic`` makes it, with this task's id and its level (and the
    worked demonstration when ``marker`` is set)."""
    ex = make_example(expression)
    demo = worked(expression, ex.answer, marker) if marker else ex.demo
    return replace(ex, prompt_id=f"arith_mixed:{expression}", demo=demo,
                   fields={"difficulty": level})


def _interleave(by_level: dict[str, list[Example]]) -> list[Example]:
    """The j-th of a level's n examples sits at position (j + 0.5) / n of the whole list, so
    every prefix holds each level in (nearly) its share."""
    keyed = [((j + 0.5) / len(exs), i, ex) for i, exs in enumerate(by_level.values())
             for j, ex in enumerate(exs)]
    return [ex for _, _, ex in sorted(keyed, key=lambda t: t[:2])]


@TASKS.register("arith_mixed", ranges={"easy": "[0, inf)", "medium": "[0, inf)",
                                       "hard": "[0, inf)", "n_train": "[1, inf)",
                                       "n_test": "[0, inf)", "train_subset": "[0, inf)"})
def arith_mixed(seed: int, *, easy: float = 1.0, medium: float = 1.0, hard: float = 1.0,
                n_train: int = 4500, n_test: int = 300, marker: str = "",
                train_subset: int = 0) -> Task:
    """Seeded arithmetic at three levels mixed by the relative weights ``easy``, ``medium``
    and ``hard`` (a zero weight leaves the level out). Each split is apportioned among the
    levels; a level with fewer problems than its train and test shares together has its
    train share capped (with a warning; the defaults fit: 1,500 + 100 of easy's 1,900), and
    a test share at or above the level's whole space is a TaskError naming the level.
    ``marker``: the answer marker of worked demonstrations (see the module docstring).
    ``train_subset`` > 0 keeps only that many train prompts (apportioned among the levels as
    the splits are, each level's first ones) after the split, so the test split and the
    problems drawn do not change: a small prompt set that training revisits every few
    steps (multi-epoch RL), held out against the same test as the full task."""
    weights = {"easy": easy, "medium": medium, "hard": hard}
    for name, w in weights.items():
        require(w >= 0, "arith_mixed", f"{name} (a level weight) must be >= 0, got {w}")
    require(sum(weights.values()) > 0, "arith_mixed",
            f"at least one of easy, medium, hard (level weights) must be > 0, got {weights}")
    require(n_train >= 1, "arith_mixed", f"n_train must be >= 1, got {n_train}")
    require(n_test >= 0, "arith_mixed", f"n_test must be >= 0, got {n_test}")
    require(0 <= train_subset <= n_train, "arith_mixed",
            f"train_subset must be in [0, n_train = {n_train}], got {train_subset}")
    require(not set(marker) & set("0123456789+-") and marker.strip() == marker,
            "arith_mixed", f"marker must hold no digit, sign or outer space, got {marker!r}")
    n_tr, n_te = apportion(n_train, weights), apportion(n_test, weights)
    keep = apportion(train_subset, weights) if train_subset else n_tr
    train: list[Example] = []
    test: dict[str, list[Example]] = {}
    for name, level in LEVELS.items():
        pool = level_pool(level)
        size = space_size(level.digits, level.ops, level.operands) if pool is None else len(pool)
        if n_te[name] and n_te[name] >= size:
            raise TaskError(f"task 'arith_mixed': level {name!r} has only {size} distinct "
                            f"problems, not enough for its {n_te[name]} of n_test={n_test} "
                            f"plus a train share; lower n_test or the weight {name}")
        if n_tr[name] + n_te[name] > size:
            warnings.warn(f"task 'arith_mixed': level {name!r} has only {size} distinct "
                          f"problems; its train share capped at {size - n_te[name]} (asked "
                          f"{n_tr[name]} of n_train={n_train}); test keeps {n_te[name]}",
                          stacklevel=2)
            n_tr[name] = size - n_te[name]
        rng = random.Random(f"{seed}:{name}")
        k = n_tr[name] + n_te[name]
        picks = _distinct_indices(rng, size, k)
        indices = picks if pool is None else [pool[i] for i in picks]
        examples = [mixed_example(level.expression(i), name, marker) for i in indices]
        train += examples[: min(n_tr[name], keep[name])]
        test[name] = examples[n_tr[name]:]
    random.Random(f"{seed}:train").shuffle(train)
    return Task(name="arith_mixed", train=train, test=_interleave(test),
                verifier={"name": "numeric", "args": {}}, answer_marker=marker)

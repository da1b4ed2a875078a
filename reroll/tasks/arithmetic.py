"""The ``arithmetic`` task: integer expressions such as ``37+45=`` with the value as answer.

Owns problem generation: every problem is one index into the space of operand tuples and
operator tuples, and a seeded sample of distinct indices gives distinct problems, so the
train and test prompts never overlap. Values follow the usual precedence (``*`` before
``+``/``-``) and are computed with ``reroll.tasks.expr``; subtraction may give a negative
answer. Must not know tokenizers or verifiers (the default reward is ``numeric``).
"""

from __future__ import annotations

import random
import warnings

from reroll.rollout import Example
from reroll.tasks.base import TASKS, Task, TaskError, require
from reroll.tasks.expr import evaluate

OPERATORS = "+-*"
_SAMPLE_LIMIT = 2**60  # random.sample needs len(range(space)) to fit in a machine integer


def space_size(digits: int, ops: str, operands: int) -> int:
    """Number of distinct problems: operand values in [0, 10**digits) and one operator
    between each pair of operands."""
    return (10**digits) ** operands * len(ops) ** (operands - 1)


def decode(index: int, digits: int, ops: str, operands: int) -> str:
    """The expression (without ``=``) with this index in the mixed-radix problem space."""
    base = 10**digits
    numbers = []
    for _ in range(operands):
        index, n = divmod(index, base)
        numbers.append(n)
    text = str(numbers[0])
    for n in numbers[1:]:
        index, k = divmod(index, len(ops))
        text += ops[k] + str(n)
    return text


def _distinct_indices(rng: random.Random, space: int, k: int) -> list[int]:
    if space <= _SAMPLE_LIMIT:
        return rng.sample(range(space), k)
    seen: set[int] = set()
    out = []
    while len(out) < k:  # space > 2**60 and k fits in memory: collisions are rare
        i = rng.randrange(space)
        if i not in seen:
            seen.add(i)
            out.append(i)
    return out


def make_example(expression: str) -> Example:
    """One problem: prompt ``expression=``, the value as answer and as demo completion."""
    answer = str(int(evaluate(expression)))
    prompt = expression + "="
    return Example(prompt_id=f"arithmetic:{expression}", prompt=prompt, answer=answer,
                   demo=answer)


@TASKS.register("arithmetic", ranges={"digits": "[1, 18]", "n_train": "[1, inf)",
                                        "n_test": "[0, inf)", "operands": "[2, 16]"})
def arithmetic(seed: int, *, digits: int = 2, ops: str = "+", n_train: int = 20000,
               n_test: int = 500, operands: int = 2) -> Task:
    """Seeded integer arithmetic. Operands have at most ``digits`` digits (0 included); one
    operator drawn from ``ops`` sits between each pair of the ``operands`` numbers. When
    fewer than ``n_train + n_test`` distinct problems exist, train is capped to what is left
    after the test set (with a warning; the defaults give 9500 train, 500 test), and
    ``n_test`` at or above the whole space is a TaskError."""
    require(digits >= 1, "arithmetic", f"digits must be >= 1, got {digits}")
    require(operands >= 2, "arithmetic", f"operands must be >= 2, got {operands}")
    require(bool(ops) and set(ops) <= set(OPERATORS) and len(set(ops)) == len(ops),
            "arithmetic", f"ops must be distinct characters from {OPERATORS!r}, got {ops!r}")
    require(n_train >= 1, "arithmetic", f"n_train must be >= 1, got {n_train}")
    require(n_test >= 0, "arithmetic", f"n_test must be >= 0, got {n_test}")
    space = space_size(digits, ops, operands)
    if n_test >= space:
        raise TaskError(
            f"task 'arithmetic': only {space} distinct problems with digits={digits}, "
            f"ops={ops!r}, operands={operands}, not enough for n_test={n_test} plus a train "
            "set; lower n_test or raise digits/operands/ops"
        )
    if n_train + n_test > space:
        warnings.warn(
            f"task 'arithmetic': only {space} distinct problems with digits={digits}, "
            f"ops={ops!r}, operands={operands}; train capped at {space - n_test} "
            f"(asked n_train={n_train}); test keeps n_test={n_test}", stacklevel=2)
        n_train = space - n_test
    rng = random.Random(seed)
    indices = _distinct_indices(rng, space, n_train + n_test)
    examples = [make_example(decode(i, digits, ops, operands)) for i in indices]
    return Task(name="arithmetic", train=examples[:n_train], test=examples[n_train:],
                verifier={"name": "numeric", "args": {}})

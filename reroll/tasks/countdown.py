"""The ``countdown`` task: reach a target from given numbers with ``+ - * /``.

Owns instance generation. An instance is built by combining all its numbers in a random
binary tree of random operators; when the value is a positive integer it becomes the
target, and the expression is kept as the demo (checked with ``reroll.tasks.expr``). Every
instance is therefore solvable. Instances are unique up to the order of their numbers, so
no test instance appears in train even with its numbers shuffled. Must not know verifiers
(the default reward is ``countdown``) or tokenizers (prompts stay short: ``3 5 2->16:``).
"""

from __future__ import annotations

import random

from reroll.rollout import Example
from reroll.tasks.base import TASKS, Task, TaskError, require
from reroll.tasks.expr import ExprError, parse

OPERATORS = "+-*/"
ATTEMPTS_PER_INSTANCE = 50  # give up (TaskError) after this many tries per wanted instance


def random_expression(rng: random.Random, numbers: list[int]) -> str:
    """A fully bracketed expression using each of ``numbers`` exactly once."""
    parts = [str(n) for n in numbers]
    while len(parts) > 1:
        i, j = rng.sample(range(len(parts)), 2)
        combined = f"({parts[i]}{rng.choice(OPERATORS)}{parts[j]})"
        parts = [p for k, p in enumerate(parts) if k not in (i, j)] + [combined]
    text = parts[0]
    return text[1:-1] if text.startswith("(") else text


def prompt_for(numbers: list[int], target: int) -> str:
    return " ".join(map(str, numbers)) + f"->{target}:"


def make_instance(rng: random.Random, count: int, max_number: int) -> Example | None:
    """One solvable instance, or None when the random expression is not a positive integer."""
    numbers = [rng.randint(1, max_number) for _ in range(count)]
    demo = random_expression(rng, numbers)
    try:
        value, used = parse(demo)
    except ExprError:  # division by zero inside the expression
        return None
    if value.denominator != 1 or value <= 0:
        return None
    if sorted(used) != sorted(numbers):  # construction invariant, not a data condition
        raise AssertionError(f"countdown demo {demo!r} does not use exactly {numbers}")
    target = int(value)
    prompt = prompt_for(numbers, target)
    return Example(prompt_id=f"countdown:{prompt}", prompt=prompt, answer=str(target),
                   demo=demo, fields={"numbers": numbers, "target": target})


def canonical_key(example: Example) -> tuple:
    return tuple(sorted(example.fields["numbers"])), example.fields["target"]


@TASKS.register("countdown", ranges={"numbers": "[2, 8]", "max_number": "[1, inf)",
                                      "n_train": "[1, inf)", "n_test": "[0, inf)"})
def countdown(seed: int, *, numbers: int = 3, max_number: int = 10, n_train: int = 2000,
              n_test: int = 200) -> Task:
    """Seeded countdown instances with ``numbers`` numbers in [1, max_number]. Raises
    TaskError when it cannot find ``n_train + n_test`` distinct instances (space too small:
    3 numbers up to 10 give only about 3,100 instances distinct up to order)."""
    require(numbers >= 2, "countdown", f"numbers must be >= 2, got {numbers}")
    require(max_number >= 1, "countdown", f"max_number must be >= 1, got {max_number}")
    require(n_train >= 1, "countdown", f"n_train must be >= 1, got {n_train}")
    require(n_test >= 0, "countdown", f"n_test must be >= 0, got {n_test}")
    rng = random.Random(seed)
    wanted = n_train + n_test
    seen: set[tuple] = set()
    examples: list[Example] = []
    for _ in range(wanted * ATTEMPTS_PER_INSTANCE):
        ex = make_instance(rng, numbers, max_number)
        if ex is None or canonical_key(ex) in seen:
            continue
        seen.add(canonical_key(ex))
        examples.append(ex)
        if len(examples) == wanted:
            return Task(name="countdown", train=examples[:n_train], test=examples[n_train:],
                        verifier={"name": "countdown", "args": {}})
    raise TaskError(
        f"task 'countdown': found only {len(examples)} distinct instances with "
        f"numbers={numbers}, max_number={max_number} after {wanted * ATTEMPTS_PER_INSTANCE} "
        f"tries, but n_train + n_test = {wanted}; lower n_train/n_test or raise "
        "numbers/max_number"
    )

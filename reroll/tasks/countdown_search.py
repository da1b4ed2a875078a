"""The ``countdown_search`` task: countdown solved by writing out the search (a reasoning trace).

The prompt is a countdown instance (``3 5 2->16:``: reach 16 from 3, 5 and 2, each used once,
all of them used, with ``+ - * /`` and positive integer intermediate values). The response is
a depth-first search written one try per line, dead ends and backtracking included, then the
answer after ``####`` as the steps of the path that reached the target::

    5+3=8 [2 8]
    8+2=10
    8*2=16
    #### 5+3=8,8*2=16

A line with a bracketed state combines two numbers and lists what is left (an inner node);
a line without one combines the last two numbers (a leaf). A leaf that equals the target ends
the search. When every try below an inner node fails, the line ``< [state]`` restates the
node the search returns to (so a small model sees the numbers it continues from). The search tries pairs in the order of the state, the larger number first, and
the operators ``+ * - /`` (``-`` only when positive, ``/`` only when exact and by more
than 1); ``order = "random"`` shuffles the tries at every node with the example's seed.

The trace length is set by where the first solution sits in that order, so it varies with
the problem and has a long tail: ``numbers`` (how many numbers), ``max_number`` (their
range: larger numbers give more exact divisions and longer lines) and ``max_value`` (tries
whose result exceeds it are not made, so every number in the trace stays small) set the
distribution. With 3 numbers up to 20 (the defaults), demos have a median of 126
characters (one token each with the character tokenizer), a p95 above 3x the median, and a
few beyond 512 (docs/reasoning.md tabulates other settings); ``max_demo`` drops instances
whose demo is longer (so every demo fits the model's context for SFT).

Owns instance generation and the solver that writes demos. Must not know verifiers (the
default reward is the ``countdown_search`` verifier, which re-checks the trace) or
tokenizers (every character is in the tiny tokenizer's charset).
"""

from __future__ import annotations

import random
from collections.abc import Iterator

from reroll.rollout import Example
from reroll.tasks.base import TASKS, Task, TaskError, require
from reroll.tasks.countdown import prompt_for, random_expression
from reroll.tasks.expr import ExprError, parse

ANSWER_MARKER = "####"
BACK = "<"  # a backtracking line: "< [state]" restates the node the search returns to
ATTEMPTS_PER_INSTANCE = 50  # give up (TaskError) after this many tries per wanted instance


def moves(state: list[int], max_value: int = 0) -> Iterator[tuple[str, list[int]]]:
    """Every try from ``state`` in the solver's order: ``("a op b=c", state after)``; with
    ``max_value`` > 0, only the tries whose result is at most ``max_value``."""
    for i in range(len(state)):
        for j in range(i + 1, len(state)):
            a, b = max(state[i], state[j]), min(state[i], state[j])
            rest = state[:i] + state[i + 1:j] + state[j + 1:]
            tries = [("+", a + b), ("*", a * b)]
            if a > b:
                tries.append(("-", a - b))
            if b > 1 and a % b == 0:
                tries.append(("/", a // b))
            for op, c in tries:
                if max_value and c > max_value:
                    continue
                yield f"{a}{op}{b}={c}", rest + [c]


def state_text(state: list[int]) -> str:
    return "[" + " ".join(map(str, state)) + "]"


class _OverBudget(Exception):
    """The trace outgrew ``search``'s ``max_chars``."""


def search(numbers: list[int], target: int, rng: random.Random | None = None,
           max_value: int = 0, compare: bool = False,
           max_chars: int = 0) -> tuple[list[str], list[str] | None]:
    """The depth-first search from ``numbers``: (trace lines, the steps that reach ``target``
    using every number, or None when no such path exists). ``rng`` shuffles the tries at
    every node; None keeps the solver's fixed order. ``max_value`` > 0 skips the tries whose
    result exceeds it. ``compare``: each leaf line ends with `` vs <target>``. ``max_chars``
    > 0: the search stops as soon as its trace (lines joined by newlines) is longer, and
    returns the lines so far and None, as a demo written from it would be longer still."""
    lines: list[str] = []
    chars = -1  # the trace's length joined by newlines: each line's length and one newline

    def add(line: str) -> None:
        nonlocal chars
        lines.append(line)
        chars += len(line) + 1
        if max_chars and chars > max_chars:
            raise _OverBudget

    def visit(state: list[int], path: list[str]) -> list[str] | None:
        tries = list(moves(state, max_value))
        if rng is not None:
            rng.shuffle(tries)
        for step, after in tries:
            if len(after) == 1:
                add(f"{step} vs {target}" if compare else step)
                if after[0] == target:
                    return path + [step]
            else:
                add(f"{step} {state_text(after)}")
                found = visit(after, path + [step])
                if found is not None:
                    return found
                add(f"{BACK} {state_text(state)}")
        return None

    try:
        return lines, visit(list(numbers), [])
    except _OverBudget:
        return lines, None


def write_demo(lines: list[str], path: list[str]) -> str:
    """The response: the trace, one try per line, then ``#### `` and the path's steps."""
    return "\n".join(lines) + f"\n{ANSWER_MARKER} " + ",".join(path)


def make_instance(rng: random.Random, count: int, max_number: int, order: str,
                  max_demo: int, max_value: int = 0, compare: bool = False) -> Example | None:
    """One instance whose search reaches its target within ``max_demo`` characters, or None."""
    numbers = [rng.randint(1, max_number) for _ in range(count)]
    try:
        value, _ = parse(random_expression(rng, numbers))
    except ExprError:  # division by zero inside the random expression
        return None
    if value.denominator != 1 or value <= 0:
        return None
    target = int(value)
    search_rng = random.Random(rng.random()) if order == "random" else None
    # a trace longer than max_demo makes a longer demo: the search stops there
    lines, path = search(numbers, target, search_rng, max_value, compare, max_chars=max_demo)
    if path is None:  # reachable only through a fraction, a negative or too large a value,
        return None   # or not within max_demo characters
    demo = write_demo(lines, path)
    if len(demo) > max_demo:
        return None
    prompt = prompt_for(numbers, target)
    return Example(prompt_id=f"countdown_search:{prompt}", prompt=prompt,
                   answer=",".join(path), demo=demo,
                   fields={"numbers": numbers, "target": target})


@TASKS.register("countdown_search", ranges={"numbers": "[2, 4]", "max_number": "[2, inf)",
                                             "n_train": "[1, inf)", "n_test": "[0, inf)",
                                             "max_demo": "[16, inf)", "max_value": "[0, inf)"})
def countdown_search(seed: int, *, numbers: int = 3, max_number: int = 20,
                     order: str = "fixed", max_demo: int = 600, max_value: int = 0,
                     compare: bool = True, n_train: int = 4000, n_test: int = 200) -> Task:
    """Seeded countdown instances with ``numbers`` numbers in [1, max_number], each with a
    written-out search as its demo (``order``: ``fixed`` or ``random`` tries; ``compare``:
    each leaf line compares its value with the target, ``25+3=28 vs 22``). Instances are
    distinct up to the order of their numbers, so no test instance appears in train. Raises
    TaskError when it cannot find ``n_train + n_test`` of them."""
    require(2 <= numbers <= 4, "countdown_search", f"numbers must be in [2, 4], got {numbers}")
    require(max_number >= 2, "countdown_search", f"max_number must be >= 2, got {max_number}")
    require(order in ("fixed", "random"), "countdown_search",
            f"order must be 'fixed' or 'random', got {order!r}")
    require(max_demo >= 16, "countdown_search", f"max_demo must be >= 16, got {max_demo}")
    require(max_value >= 0, "countdown_search", f"max_value must be >= 0, got {max_value}")
    require(n_train >= 1, "countdown_search", f"n_train must be >= 1, got {n_train}")
    require(n_test >= 0, "countdown_search", f"n_test must be >= 0, got {n_test}")
    rng = random.Random(seed)
    wanted = n_train + n_test
    seen: set[tuple] = set()
    examples: list[Example] = []
    for _ in range(wanted * ATTEMPTS_PER_INSTANCE):
        ex = make_instance(rng, numbers, max_number, order, max_demo, max_value, compare)
        if ex is None:
            continue
        key = (tuple(sorted(ex.fields["numbers"])), ex.fields["target"])
        if key in seen:
            continue
        seen.add(key)
        examples.append(ex)
        if len(examples) == wanted:
            return Task(name="countdown_search", train=examples[:n_train],
                        test=examples[n_train:], verifier={"name": "countdown_search",
                                                           "args": {}},
                        answer_marker=ANSWER_MARKER)
    raise TaskError(
        f"task 'countdown_search': found only {len(examples)} distinct instances with "
        f"numbers={numbers}, max_number={max_number}, max_value={max_value}, "
        f"max_demo={max_demo} after "
        f"{wanted * ATTEMPTS_PER_INSTANCE} tries, but n_train + n_test = {wanted}; lower "
        "n_train/n_test or raise max_number/max_value/max_demo"
    )

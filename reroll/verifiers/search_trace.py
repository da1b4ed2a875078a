"""The ``countdown_search`` verifier: a countdown answer after a written-out search, checked
against the numbers, the target and the trace itself.

Owns that judgement. Must not know how the trace was produced (a demo or a sample) nor where
scoring runs. The format is the ``countdown_search`` task's (``reroll.tasks.countdown_search``
writes it): one try per line, ``a op b=c [state]`` for an inner node (the numbers left),
``a op b=c`` for a leaf, ``< [state]`` when the search backtracks, then ``#### `` and the
answer as comma-separated steps.

A completion scores 1.0 when all of these hold, else 0.0 with the reason in ``info``:

- it has an answer after the last ``####`` (its first line), made of steps ``a op b=c``;
- every step is exact arithmetic with a positive integer result, takes its two numbers from
  what is available (the given numbers, then the results so far), and the last step leaves
  only the target: every given number used once;
- (``require_support``) the trace supports the answer: it holds a leaf line whose branch
  (the inner nodes above it, found by their depth: an inner node with ``k`` numbers left sits
  at depth ``len(numbers) - k``) is the answer's steps in order, each inner node listing the
  numbers that are in fact left. An answer stated without having been reached in the search
  (a guess, or copied from nowhere) is refused.
"""

from __future__ import annotations

import re
from collections import Counter
from dataclasses import dataclass

from reroll.rollout import Example, Rollout, Score
from reroll.tasks.countdown_search import ANSWER_MARKER, BACK
from reroll.verifiers.base import VERIFIERS, Verifier, judged, need_field

STEP = re.compile(r"(\d+)([-+*/])(\d+)=(\d+)")
# a try: "a op b=c", then " [state]" (an inner node) or, on a leaf, optionally " vs t" (the
# comparison with the target that the task's ``compare`` format writes)
LINE = re.compile(r"(\d+[-+*/]\d+=\d+)(?: \[(\d+(?: \d+)*)\]| vs \d+)?")


def apply(a: int, op: str, b: int) -> int | None:
    """``a op b`` when it is a positive integer, else None."""
    if op == "+":
        c = a + b
    elif op == "-":
        c = a - b
    elif op == "*":
        c = a * b
    else:
        if b == 0 or a % b:
            return None
        c = a // b
    return c if c > 0 else None


def replay(steps: list[str], numbers: list[int], target: int
           ) -> tuple[list[tuple[int, ...]] | None, str]:
    """The numbers left after each step (sorted tuples), or None with the reason the answer
    is wrong."""
    pool = Counter(numbers)
    after = []
    for step in steps:
        m = STEP.fullmatch(step)
        if m is None:
            return None, f"step {step!r} is not 'a op b=c'"
        a, op, b, c = int(m[1]), m[2], int(m[3]), int(m[4])
        if apply(a, op, b) != c:
            return None, f"step {step!r} is wrong arithmetic"
        need = Counter([a, b])
        if need - pool:
            return None, f"step {step!r} uses numbers not available (left: {sorted(pool.elements())})"
        pool = pool - need + Counter([c])
        after.append(tuple(sorted(pool.elements())))
    if not after or after[-1] != (target,):
        left = sorted(pool.elements())
        return None, f"answer leaves {left}, not the target {target} alone"
    return after, ""


def supported(trace: str, steps: list[str], after: list[tuple[int, ...]], n: int) -> bool:
    """Whether some leaf of ``trace`` sits on a branch equal to ``steps`` (module docstring)."""
    branch: list[tuple[str, tuple[int, ...] | None]] = []
    want = list(zip(steps, after[:-1] + [None], strict=True))
    for raw in trace.splitlines():
        line = raw.strip()
        if not line or line.startswith(BACK):
            continue
        m = LINE.fullmatch(line)
        if m is None:
            continue  # a malformed line belongs to no branch
        state = tuple(sorted(int(x) for x in m[2].split())) if m[2] else None
        depth = n - len(state) if state is not None else n - 1
        if depth < 1:
            continue
        branch = branch[:depth - 1] + [(m[1], state)]
        if state is None and branch == want:
            return True
    return False


@dataclass
class SearchTraceVerifier:
    require_support: bool = True
    name: str = "countdown_search"

    def __call__(self, rollout: Rollout, example: Example) -> Score:
        numbers = [int(x) for x in need_field(self.name, example, "numbers")]
        target = int(need_field(self.name, example, "target"))
        text = rollout.completion
        if ANSWER_MARKER not in text:
            return judged(self.name, 0.0, f"no answer after {ANSWER_MARKER!r}", parsed=None)
        trace, tail = text.rsplit(ANSWER_MARKER, 1)
        answer = (tail.strip().splitlines() or [""])[0].strip()
        steps = [s.strip() for s in answer.split(",")] if answer else []
        after, why = replay(steps, numbers, target)
        if after is None:
            return judged(self.name, 0.0, why or "empty answer", parsed=answer)
        if self.require_support and not supported(trace, steps, after, len(numbers)):
            return judged(self.name, 0.0, "the trace does not reach this answer",
                          parsed=answer)
        return judged(self.name, 1.0, f"reaches {target} using {sorted(numbers)}",
                      parsed=answer)


@VERIFIERS.register("countdown_search", cheap=True)
def countdown_search(*, require_support: bool = True) -> Verifier:
    """1.0 when the answer after ``####`` reaches ``fields["target"]`` using each of
    ``fields["numbers"]`` once, by exact positive-integer steps, and (``require_support``)
    the search trace before it reached that answer; else 0.0."""
    return SearchTraceVerifier(require_support=require_support)

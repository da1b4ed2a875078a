"""Rule verifiers: ``format`` (a regex over the completion) and ``countdown`` (an arithmetic
expression that must reach a target with the given numbers).

Owns those two judgements. Must not know where scoring runs. The arithmetic is parsed by
``reroll.tasks.expr`` (exact fractions, never ``eval``).

Countdown rule (the standard game): each given number may be used *at most once* (the
numbers used must be a sub-multiset of ``fields["numbers"]``); using all of them is not
required unless ``use_all=True``. A malformed expression is a wrong answer (0.0, reason in
``info``), not an error.
"""

from __future__ import annotations

import re
from collections import Counter
from dataclasses import dataclass, field

from reroll.rollout import Example, Rollout, Score
from reroll.tasks.expr import ExprError, parse
from reroll.verifiers.base import VERIFIERS, Verifier, judged, need_field
from reroll.verifiers.extract import check_mode, extract

THINK_ANSWER = r"\s*<think>.*?</think>\s*<answer>.*?</answer>\s*"


@dataclass
class FormatVerifier:
    pattern: str = THINK_ANSWER
    fullmatch: bool = True
    name: str = "format"
    regex: re.Pattern = field(init=False, repr=False)

    def __post_init__(self) -> None:
        try:
            self.regex = re.compile(self.pattern, re.DOTALL)
        except re.error as e:
            raise ValueError(f"verifier 'format': pattern {self.pattern!r} is not a valid "
                             f"regular expression: {e}") from None

    def __call__(self, rollout: Rollout, example: Example) -> Score:
        text = rollout.completion
        m = self.regex.fullmatch(text) if self.fullmatch else self.regex.search(text)
        how = "match the whole completion" if self.fullmatch else "occur in the completion"
        if m:
            return judged(self.name, 1.0, f"pattern does {how}", parsed=m.group(0))
        return judged(self.name, 0.0, f"pattern does not {how}", parsed=None)


@VERIFIERS.register("format")
def format_(*, pattern: str = THINK_ANSWER, fullmatch: bool = True) -> Verifier:
    """1.0 when the completion matches ``pattern`` (``re.DOTALL``; the whole completion
    when ``fullmatch``, anywhere otherwise), else 0.0. The default pattern asks for
    ``<think>...</think>`` followed by ``<answer>...</answer>`` and nothing else."""
    return FormatVerifier(pattern=pattern, fullmatch=fullmatch)


def _expression(text: str, mode: str) -> tuple[str | None, str]:
    """The candidate expression: boxed, tags or answer phrase, else the last non-empty line;
    of ``lhs = rhs`` the side that holds an operator."""
    if mode == "auto":
        found, how = None, "auto"
        for m in ("boxed", "tags", "answer"):
            found, how = extract(text, m)
            if found is not None:
                break
        if found is None:
            lines = [ln.strip() for ln in text.splitlines() if ln.strip()]
            found, how = (lines[-1], "last_line") if lines else (None, "auto")
    else:
        found, how = extract(text, mode)
    if found is None:
        return None, how
    found = found.replace("×", "*").replace("÷", "/").replace("\\times", "*").replace(
        "\\div", "/").replace("$", "")
    if "=" in found:
        sides = [s.strip() for s in found.split("=")]
        found = next((s for s in sides if re.search(r"[-+*/]", s)), sides[0])
    return found, how


@dataclass
class CountdownVerifier:
    use_all: bool = False
    extract: str = "auto"
    name: str = "countdown"

    def __call__(self, rollout: Rollout, example: Example) -> Score:
        numbers = [int(n) for n in need_field(self.name, example, "numbers")]
        target = int(need_field(self.name, example, "target"))
        expr, how = _expression(rollout.completion, self.extract)
        if not expr:
            return judged(self.name, 0.0, "no expression found", parsed=None)
        try:
            value, used = parse(expr)
        except ExprError as e:
            return judged(self.name, 0.0, f"malformed expression: {e}", parsed=expr, how=how)
        over = Counter(used) - Counter(numbers)
        if over:
            bad = ", ".join(f"{n} x{c}" for n, c in sorted(over.items()))
            return judged(self.name, 0.0, f"uses numbers not available (extra: {bad}; "
                          f"given {numbers})", parsed=expr, how=how, result=str(value))
        if self.use_all and Counter(used) != Counter(numbers):
            left = sorted((Counter(numbers) - Counter(used)).elements())
            return judged(self.name, 0.0, f"numbers left unused: {left}", parsed=expr,
                          how=how, result=str(value))
        if value != target:
            return judged(self.name, 0.0, f"expression equals {value}, target is {target}",
                          parsed=expr, how=how, result=str(value))
        return judged(self.name, 1.0, f"reaches {target} using {used}", parsed=expr, how=how,
                      result=str(value))


@VERIFIERS.register("countdown", cheap=True)
def countdown(*, use_all: bool = False, extract: str = "auto") -> Verifier:
    """1.0 when the completion's expression equals ``fields["target"]`` using each of
    ``fields["numbers"]`` at most once (exactly once each when ``use_all``), else 0.0."""
    if extract != "auto":
        check_mode(extract, "countdown")
    return CountdownVerifier(use_all=use_all, extract=extract)

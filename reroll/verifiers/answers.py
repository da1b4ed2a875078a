"""Final-answer verifiers: ``math`` (symbolic equivalence), ``numeric`` (tolerance), ``exact``.

Owns comparing one extracted answer with ``example.answer``. Must not know the task that
produced the example, nor where scoring runs.

``math`` uses the ``math-verify`` package with its own timeouts switched off
(``parsing_timeout=None``, ``timeout_seconds=None``): they rely on ``signal.alarm``, which
only works in a main thread; the scoring pool enforces the time limit instead. Gold answers
are parsed once and cached. math-verify rounds floats to ``float_rounding`` digits, so
``0.333333`` matches ``1/3`` while ``0.33`` does not; a percentage matches both its number
and its fraction (``50\\%`` equals ``50`` and ``0.5``).
"""

from __future__ import annotations

import functools
import logging
import re
from dataclasses import dataclass
from fractions import Fraction

from reroll.rollout import Example, Rollout, Score
from reroll.verifiers.base import VERIFIERS, Verifier, judged
from reroll.verifiers.extract import answer_phrase, check_mode, extract, last_boxed


class _NoTimeoutWarning(logging.Filter):
    """math-verify warns once that its timeout is off; here the pool owns the timeout."""

    def filter(self, record: logging.LogRecord) -> bool:
        return "Timeout is disabled" not in record.getMessage()


for _name in ("math_verify.parser", "math_verify.grader"):
    logging.getLogger(_name).addFilter(_NoTimeoutWarning())


def _mv():
    import math_verify  # imported on first use: it pulls in sympy (about a second)

    return math_verify


def _as_latex(text: str) -> str:
    return text if ("$" in text or "\\boxed" in text) else f"${text}$"


def _strip_currency(text: str) -> str:
    """``\\$18.90`` (an escaped dollar sign, as in ``\\boxed{\\$18.90}``) -> ``18.90``."""
    return text.replace("\\$", "").strip()


@functools.lru_cache(maxsize=65536)
def _parse_gold(answer: str) -> tuple:
    return tuple(_mv().parse(_as_latex(answer), parsing_timeout=None))


def _norm_text(s: str, case_sensitive: bool = False) -> str:
    s = re.sub(r"\s+", " ", s.strip()).rstrip(".").strip()
    return s if case_sensitive else s.casefold()


@dataclass
class MathVerifier:
    extract: str = "auto"
    float_rounding: int = 6
    name: str = "math"

    def warmup(self) -> None:
        """Import sympy and math-verify now (about a second), not inside the first call."""
        _mv().verify(list(_parse_gold("1/2")), _mv().parse("$0.5$", parsing_timeout=None),
                     timeout_seconds=None)

    def __call__(self, rollout: Rollout, example: Example) -> Score:
        found, how = extract(rollout.completion, self.extract)
        if found is None:
            return judged(self.name, 0.0, f"no answer found (extract={self.extract})", parsed=None)
        found = _strip_currency(found)
        stated = answer_phrase(rollout.completion) if self.extract == "auto" else None
        if how == "boxed" and stated is not None:
            stated = _strip_currency(last_boxed(stated) or stated)
            if not self._judge(stated, example)[0]:  # a box and a different stated answer
                return judged(self.name, 0.0, f"the boxed answer {found!r} and the stated final "
                              f"answer {stated!r} are not both right", parsed=found, how=how)
        ok, reason = self._judge(found, example)
        return judged(self.name, float(ok), reason, parsed=found, how=how)

    def _judge(self, found: str, example: Example) -> tuple[bool, str]:
        gold = _parse_gold(example.answer)
        if all(isinstance(g, str) for g in gold):  # no math in the reference: compare text
            same = _norm_text(found) == _norm_text(example.answer)
            return same, "reference is not math; compared as text " + (
                "(equal)" if same else "(different)")
        pred = _mv().parse(_as_latex(found), parsing_timeout=None)
        if not pred:
            return False, f"could not parse answer {found!r}"
        ok = _mv().verify(list(gold), pred, float_rounding=self.float_rounding,
                          timeout_seconds=None)
        return ok, "equivalent" if ok else f"{pred[-1]!s} is not equivalent to {gold[-1]!s}"


@VERIFIERS.register("math", ranges={"float_rounding": "[0, 15]"})
def math(*, extract: str = "auto", float_rounding: int = 6) -> Verifier:
    """1.0 when the extracted answer is mathematically equivalent to ``example.answer``
    (fractions, LaTeX, decimals, intervals, sets, percentages), else 0.0. ``extract`` is
    an extraction mode of ``reroll.verifiers.extract``."""
    check_mode(extract, "math")
    return MathVerifier(extract=extract, float_rounding=float_rounding)


def _parse_number(text: str) -> Fraction | None:
    s = re.sub(r"[\s,$]", "", text)
    scale = Fraction(1)
    if s.endswith("%") or s.endswith("\\%"):
        s, scale = s.rstrip("%").rstrip("\\"), Fraction(1, 100)
    try:
        if "/" in s:
            num, den = s.split("/", 1)
            return Fraction(num) / Fraction(den) * scale
        return Fraction(s) * scale
    except (ValueError, ZeroDivisionError):
        return None


_cached_number = functools.lru_cache(maxsize=1 << 14)(_parse_number)


def to_number(text: str) -> Fraction | None:
    """``-1,000.5``, ``3/4``, ``2.5e3``, ``50%`` as an exact Fraction; None if not a number.
    Short texts (extracted answers, references) repeat across a group's samples and across
    epochs, so they are cached (0.1 vs ~10 us; a Fraction is immutable, safe to share); long
    ones (a whole completion, with ``extract = "none"``) are not kept."""
    return _cached_number(text) if len(text) <= 64 else _parse_number(text)


@dataclass
class NumericVerifier:
    tolerance: float = 1e-6
    relative: bool = False
    extract: str = "last_number"
    name: str = "numeric"

    def __call__(self, rollout: Rollout, example: Example) -> Score:
        gold = to_number(example.answer)
        if gold is None:
            raise ValueError(f"verifier 'numeric': reference answer {example.answer!r} of "
                             f"example {example.prompt_id!r} is not a number")
        found, how = extract(rollout.completion, self.extract)
        if found is None:
            return judged(self.name, 0.0, f"no answer found (extract={self.extract})", parsed=None)
        pred = to_number(found)
        if pred is None:
            return judged(self.name, 0.0, f"{found!r} is not a number", parsed=found, how=how)
        try:
            bound = self.tolerance * (abs(float(gold)) if self.relative else 1.0)
            diff = abs(float(pred) - float(gold))
        except OverflowError:  # beyond a float: compared exactly, a wrong answer, not an error
            exact_diff = abs(pred - gold)
            limit = Fraction(self.tolerance) * (abs(gold) if self.relative else 1)
            ok = exact_diff <= limit
            reason = ("beyond float range, compared exactly: the difference is "
                      + ("within" if ok else "beyond") + f" the tolerance {self.tolerance:g}")
            return judged(self.name, float(ok), reason, parsed=found, how=how)
        ok = diff <= bound
        reason = f"|{float(pred):g} - {float(gold):g}| = {diff:g} " + ("<=" if ok else ">") + \
            f" {bound:g}"
        return judged(self.name, float(ok), reason, parsed=found, how=how)


@VERIFIERS.register("numeric", ranges={"tolerance": "[0, inf)"}, cheap=True)
def numeric(*, tolerance: float = 1e-6, relative: bool = False,
            extract: str = "last_number") -> Verifier:
    """1.0 when ``|answer - reference| <= tolerance`` (times ``|reference|`` when
    ``relative``), else 0.0. A reference that is not a number is an error (broken data)."""
    check_mode(extract, "numeric")
    if tolerance < 0:
        raise ValueError(f"verifier 'numeric': tolerance must be >= 0, got {tolerance}")
    return NumericVerifier(tolerance=tolerance, relative=relative, extract=extract)


@dataclass
class ExactVerifier:
    normalize: bool = True
    case_sensitive: bool = False
    extract: str = "none"
    name: str = "exact"

    def __call__(self, rollout: Rollout, example: Example) -> Score:
        found, how = extract(rollout.completion, self.extract)
        if found is None:
            return judged(self.name, 0.0, f"no answer found (extract={self.extract})", parsed=None)
        if self.normalize:
            a, b = _norm_text(found, self.case_sensitive), _norm_text(example.answer,
                                                                      self.case_sensitive)
        else:
            a, b = found, example.answer
        ok = a == b
        reason = "equal" if ok else f"{a!r} != {b!r}"
        return judged(self.name, float(ok), reason, parsed=found, how=how)


@VERIFIERS.register("exact", cheap=True)
def exact(*, normalize: bool = True, case_sensitive: bool = False,
          extract: str = "none") -> Verifier:
    """1.0 when the extracted answer equals ``example.answer`` as a string. ``normalize``
    strips, collapses whitespace and drops a trailing period; case is ignored unless
    ``case_sensitive``. Without ``normalize`` the strings must be identical."""
    check_mode(extract, "exact")
    return ExactVerifier(normalize=normalize, case_sensitive=case_sensitive, extract=extract)

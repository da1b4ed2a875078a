"""Answer extraction: pull the final answer out of a completion. Pure string functions.

Owns the extraction modes shared by the answer verifiers (``EXTRACT_MODES``):

- ``boxed``: the content of the last ``\\boxed{...}`` (or ``\\fbox{...}``), braces balanced;
- ``tags``: the content of the last ``<answer>...</answer>``;
- ``answer``: the text after the last "the answer is" / "answer:" / "final answer:" (up to
  the end of that line, trailing period dropped);
- ``last_number``: the last number in the text (``-1,000.5``, ``3/4`` and ``2.5e3`` forms);
- ``auto``: the first of boxed, tags, answer, last_number that finds something;
- ``none``: the whole completion, stripped.

Every function returns ``None`` when it finds nothing. Must not know about scores.
"""

from __future__ import annotations

import re

EXTRACT_MODES = ("auto", "boxed", "tags", "answer", "last_number", "none")

_BOX = re.compile(r"\\(?:boxed|fbox)\s*\{")
_TAGS = re.compile(r"<answer>(.*?)</answer>", re.DOTALL | re.IGNORECASE)
_ANSWER = re.compile(r"\banswer\s*(?:is\s*[:=]?|[:=])\s*(.+)", re.IGNORECASE)
NUMBER = r"[-+]?(?:\d{1,3}(?:,\d{3})+|\d+)(?:\.\d+)?(?:[eE][-+]?\d+)?(?:\s*/\s*\d+)?"
_NUMBER = re.compile(r"(?<![\w.])" + NUMBER)


def last_boxed(text: str) -> str | None:
    """Content of the last ``\\boxed{...}``; nested braces balanced; None if unclosed."""
    matches = list(_BOX.finditer(text))
    for m in reversed(matches):
        depth, start = 1, m.end()
        for i in range(start, len(text)):
            if text[i] == "{":
                depth += 1
            elif text[i] == "}":
                depth -= 1
                if depth == 0:
                    return text[start:i].strip()
    return None


def last_tagged(text: str) -> str | None:
    found = _TAGS.findall(text)
    return found[-1].strip() if found else None


def answer_phrase(text: str) -> str | None:
    """Text after the last answer phrase, to the end of its line, trailing period dropped."""
    found = None
    for line in text.splitlines():
        for m in _ANSWER.finditer(line):
            found = m.group(1)
    if found is None:
        return None
    found = found.strip().rstrip(".").strip()
    if found.startswith("$") and found.endswith("$") and len(found) > 1:
        found = found.strip("$").strip()
    return found or None


def last_number(text: str) -> str | None:
    found = _NUMBER.findall(text)
    return re.sub(r"\s+", "", found[-1]) if found else None


def whole(text: str) -> str | None:
    return text.strip() or None


_MODES = {
    "boxed": last_boxed,
    "tags": last_tagged,
    "answer": answer_phrase,
    "last_number": last_number,
    "none": whole,
}


def check_mode(mode: str, verifier: str) -> None:
    if mode not in EXTRACT_MODES:
        raise ValueError(
            f"verifier {verifier!r}: extract={mode!r} is not one of {', '.join(EXTRACT_MODES)}"
        )


def extract(text: str, mode: str = "auto") -> tuple[str | None, str]:
    """(answer, mode that found it). ``auto`` tries boxed, tags, answer, last_number."""
    check_mode(mode, "extract")
    order = ("boxed", "tags", "answer", "last_number") if mode == "auto" else (mode,)
    for m in order:
        found = _MODES[m](text)
        if found is not None:
            return found, m
    return None, mode

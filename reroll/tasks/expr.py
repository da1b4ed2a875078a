"""A small safe arithmetic-expression parser (countdown answers); never calls eval.

Grammar (recursive descent over a token list):
    expr   := term (('+' | '-') term)*
    term   := factor (('*' | '/') factor)*
    factor := NUMBER | '(' expr ')' | '-' factor
Values are exact `Fraction`s so that 6/4*2 == 3 holds. Anything else is an `ExprError`
naming the offending position. Length and nesting are bounded.
"""

from __future__ import annotations

import re
from fractions import Fraction

MAX_LEN = 200
MAX_DEPTH = 32
_TOKEN = re.compile(r"\s*(?:(\d+)|(.))")


class ExprError(ValueError):
    pass


def tokenize(text: str) -> list[str]:
    if len(text) > MAX_LEN:
        raise ExprError(f"expression longer than {MAX_LEN} characters")
    out = []
    for m in _TOKEN.finditer(text):
        num, op = m.groups()
        if num is not None:
            out.append(num)
        elif op is not None and not op.isspace():
            if op not in "+-*/()":
                raise ExprError(f"unexpected character {op!r} at position {m.start(2)}")
            out.append(op)
    return out


class _Parser:
    def __init__(self, tokens: list[str]):
        self.toks, self.i, self.numbers = tokens, 0, []

    def peek(self) -> str | None:
        return self.toks[self.i] if self.i < len(self.toks) else None

    def take(self) -> str:
        tok = self.peek()
        if tok is None:
            raise ExprError("unexpected end of expression")
        self.i += 1
        return tok

    def expr(self, depth: int) -> Fraction:
        value = self.term(depth)
        while self.peek() in ("+", "-"):
            op = self.take()
            rhs = self.term(depth)
            value = value + rhs if op == "+" else value - rhs
        return value

    def term(self, depth: int) -> Fraction:
        value = self.factor(depth)
        while self.peek() in ("*", "/"):
            op = self.take()
            rhs = self.factor(depth)
            if op == "/" and rhs == 0:
                raise ExprError("division by zero")
            value = value * rhs if op == "*" else value / rhs
        return value

    def factor(self, depth: int) -> Fraction:
        if depth > MAX_DEPTH:
            raise ExprError(f"expression nested deeper than {MAX_DEPTH}")
        tok = self.take()
        if tok.isdigit():
            self.numbers.append(int(tok))
            return Fraction(int(tok))
        if tok == "(":
            value = self.expr(depth + 1)
            if self.take() != ")":
                raise ExprError("missing ')'")
            return value
        if tok == "-":
            return -self.factor(depth + 1)
        raise ExprError(f"unexpected token {tok!r}")


def parse(text: str) -> tuple[Fraction, list[int]]:
    """Value of ``text`` and the integer literals it used, in order."""
    toks = tokenize(text)
    if not toks:
        raise ExprError("empty expression")
    p = _Parser(toks)
    value = p.expr(0)
    if p.peek() is not None:
        raise ExprError(f"unexpected token {p.peek()!r} after a complete expression")
    return value, p.numbers


def evaluate(text: str) -> Fraction:
    return parse(text)[0]

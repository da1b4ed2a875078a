"""The safe expression parser: exact values by hand, literals in order, errors by position."""

import re
from fractions import Fraction

import pytest

from reroll.tasks.expr import MAX_DEPTH, MAX_LEN, ExprError, evaluate, parse


@pytest.mark.parametrize("text, value, literals", [
    ("6/4*2", Fraction(3), [6, 4, 2]),  # (6/4)*2 = 3/2*2 = 3, exact, no float rounding
    ("2+3*4", Fraction(14), [2, 3, 4]),  # 3*4 = 12 first, then 2 + 12
    ("(1+2)*3", Fraction(9), [1, 2, 3]),
    ("10-4-3", Fraction(3), [10, 4, 3]),  # left associative: (10-4)-3 = 3, not 10-(4-3) = 9
    ("-3+5", Fraction(2), [3, 5]),
    (" 7 / ( 2 ) ", Fraction(7, 2), [7, 2]),
])
def test_values_and_literals_by_hand(text, value, literals):
    assert parse(text) == (value, literals)


@pytest.mark.parametrize("text, message", [
    ("1/0", "division by zero"),
    ("1/(2-2)", "division by zero"),
    ("2+", "unexpected end"),
    ("(1+2", "unexpected end"),
    ("1 2", "unexpected token '2' after a complete expression"),
    ("2^3", "unexpected character '^' at position 1"),
    ("", "empty expression"),
    ("__import__('os')", "unexpected character '_' at position 0"),
])
def test_bad_expressions_raise_expr_error(text, message):
    with pytest.raises(ExprError, match=re.escape(message)):
        parse(text)


def test_length_and_depth_are_bounded():
    with pytest.raises(ExprError, match="longer than"):
        evaluate("1+" * (MAX_LEN // 2) + "1")
    deep = "(" * (MAX_DEPTH + 2) + "1" + ")" * (MAX_DEPTH + 2)
    assert len(deep) <= MAX_LEN
    with pytest.raises(ExprError, match="nested deeper"):
        evaluate(deep)

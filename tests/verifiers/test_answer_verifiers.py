"""numeric, exact, format and countdown verifiers: correct, wrong and malformed answers."""

import pytest

from reroll.rollout import Example, Rollout
from reroll.verifiers import VERIFIERS


def judge(name: str, completion: str, answer: str = "", fields=None, **args):
    v = VERIFIERS.get(name)(**args)
    return v(Rollout("p", "g", [0], 0, completion=completion),
             Example("p7", "q", answer, fields=fields or {}))


# ---- numeric -----------------------------------------------------------------------
def test_numeric_within_absolute_tolerance_is_correct():
    # |3.1416 - 3.14159| = 1e-5 <= 1e-4
    s = judge("numeric", "about 3.1416", "3.14159", tolerance=1e-4)
    assert s.value == 1.0 and s.info["parsed"] == "3.1416"


def test_numeric_outside_tolerance_is_wrong_with_the_difference():
    # |3.2 - 3.14159| = 0.05841 > 1e-4
    s = judge("numeric", "3.2", "3.14159", tolerance=1e-4)
    assert s.ok and s.value == 0.0 and "0.05841 > 0.0001" in s.info["reason"]


def test_numeric_relative_tolerance_scales_with_reference():
    # bound = 0.01 * 1000 = 10; |1009 - 1000| = 9 passes, |1011 - 1000| = 11 fails
    assert judge("numeric", "1,009", "1000", tolerance=0.01, relative=True).value == 1.0
    assert judge("numeric", "1011", "1000", tolerance=0.01, relative=True).value == 0.0


def test_numeric_fraction_and_percent_answers_are_numbers():
    assert judge("numeric", "3/4", "0.75").value == 1.0
    assert judge("numeric", "the answer is 75%", "0.75", extract="answer").value == 1.0


def test_numeric_answer_beyond_float_range_is_wrong_not_error():
    """A 400-digit answer (a model's early garbage) overflows a float: it is a wrong answer
    (compared exactly), never a verifier error; and exact comparison still accepts a huge
    answer equal to a huge reference."""
    huge = "9" * 400
    s = judge("numeric", huge, "12")
    assert s.ok and s.value == 0.0 and "beyond float range" in s.info["reason"]
    assert judge("numeric", huge, huge).value == 1.0  # |x - x| = 0 <= 1e-6
    # relative: bound = 0.01 * 10^400 > |10^400 + 1 - 10^400| = 1
    assert judge("numeric", "1" + "0" * 399 + "1", "1" + "0" * 400,
                 tolerance=0.01, relative=True).value == 1.0


def test_numeric_no_number_is_wrong_not_error():
    s = judge("numeric", "I cannot say", "4")
    assert s.ok and s.value == 0.0 and s.info["parsed"] is None


def test_numeric_non_number_answer_is_wrong_not_error():
    s = judge("numeric", "the answer is five", "5", extract="answer")
    assert s.ok and s.value == 0.0 and s.info["reason"] == "'five' is not a number"


def test_numeric_broken_reference_raises_naming_example():
    with pytest.raises(ValueError, match="'abc' of example 'p7' is not a number"):
        judge("numeric", "5", "abc")


def test_numeric_rejects_negative_tolerance():
    with pytest.raises(ValueError, match="tolerance must be >= 0"):
        VERIFIERS.get("numeric")(tolerance=-1.0)


# ---- exact -------------------------------------------------------------------------
def test_exact_normalises_space_case_and_trailing_period():
    assert judge("exact", "  1 2   3. ", "1 2 3").value == 1.0
    assert judge("exact", "Paris", "paris").value == 1.0


def test_exact_case_sensitive_and_unnormalised_modes():
    assert judge("exact", "Paris", "paris", case_sensitive=True).value == 0.0
    assert judge("exact", "1 2 3 ", "1 2 3", normalize=False, extract="none").value == 1.0
    assert judge("exact", "1  2 3", "1 2 3", normalize=False).value == 0.0


def test_exact_wrong_and_empty():
    s = judge("exact", "1 3 2", "1 2 3")
    assert s.value == 0.0 and s.info["reason"] == "'1 3 2' != '1 2 3'"
    e = judge("exact", "   ", "1 2 3")
    assert e.ok and e.value == 0.0 and e.info["parsed"] is None


def test_exact_with_tag_extraction():
    assert judge("exact", "<think>hm</think><answer>b a</answer>", "b a", extract="tags").value == 1.0


# ---- format ------------------------------------------------------------------------
def test_format_think_then_answer_matches():
    s = judge("format", "<think>\n2+2\n</think>\n<answer>4</answer>\n")
    assert s.value == 1.0


def test_format_missing_or_trailing_text_fails_fullmatch():
    assert judge("format", "<answer>4</answer>").value == 0.0
    assert judge("format", "<think>x</think><answer>4</answer> extra").value == 0.0


def test_format_search_mode_and_custom_pattern():
    assert judge("format", "xx #### 42", pattern=r"#### \d+", fullmatch=False).value == 1.0
    assert judge("format", "xx #### 42", pattern=r"#### \d+").value == 0.0


def test_format_invalid_regex_fails_at_build_naming_pattern():
    with pytest.raises(ValueError, match=r"pattern '\(' is not a valid regular expression"):
        VERIFIERS.get("format")(pattern="(")


# ---- countdown ---------------------------------------------------------------------
CD = {"numbers": [3, 5, 7, 25], "target": 46}


def test_countdown_correct_expression_each_number_at_most_once():
    # 25 + 3*7 = 46 uses 25, 3, 7 (5 unused: allowed)
    s = judge("countdown", "<answer>25 + 3*7</answer>", fields=CD)
    assert s.value == 1.0 and s.info["parsed"] == "25 + 3*7"


def test_countdown_equation_and_last_line_forms():
    assert judge("countdown", "trying...\n(25 + 3*7) = 46", fields=CD).value == 1.0
    assert judge("countdown", r"\boxed{46 = 7*3+25}", fields=CD).value == 1.0


def test_countdown_wrong_value_reports_it():
    # 25 + 3*5 = 40 != 46
    s = judge("countdown", "<answer>25 + 3*5</answer>", fields=CD)
    assert s.value == 0.0 and s.info["reason"] == "expression equals 40, target is 46"


def test_countdown_number_used_twice_is_wrong():
    # 7*7 - 3 = 46 but 7 is given once
    s = judge("countdown", "<answer>7*7 - 3</answer>", fields=CD)
    assert s.value == 0.0 and "extra: 7 x1" in s.info["reason"]


def test_countdown_number_not_given_is_wrong():
    s = judge("countdown", "<answer>40 + 6</answer>", fields=CD)
    assert s.value == 0.0 and "6 x1" in s.info["reason"] and "40 x1" in s.info["reason"]


def test_countdown_use_all_requires_every_number():
    # 25 + 3*7 = 46 leaves 5 unused
    s = judge("countdown", "<answer>25 + 3*7</answer>", fields=CD, use_all=True)
    assert s.value == 0.0 and s.info["reason"] == "numbers left unused: [5]"
    full = {"numbers": [2, 3, 4], "target": 14}  # 2 + 3*4 = 14 uses all three
    assert judge("countdown", "<answer>2 + 3*4</answer>", fields=full, use_all=True).value == 1.0


def test_countdown_malformed_expression_is_wrong_not_error():
    s = judge("countdown", "<answer>25 + * 7</answer>", fields=CD)
    assert s.ok and s.value == 0.0 and s.info["reason"].startswith("malformed expression:")
    t = judge("countdown", "<answer>import os</answer>", fields=CD)
    assert t.ok and t.value == 0.0 and "unexpected character" in t.info["reason"]
    z = judge("countdown", "<answer>25 / (7 - 7)</answer>", fields=CD)
    assert z.ok and z.value == 0.0 and "division by zero" in z.info["reason"]


def test_countdown_exact_fractions_no_float_error():
    # 7 / 3 * 3 = 7 exactly with fractions
    s = judge("countdown", "<answer>7 / 3 * 3</answer>", fields={"numbers": [7, 3, 3], "target": 7})
    assert s.value == 1.0


def test_countdown_empty_completion_is_wrong():
    s = judge("countdown", "   ", fields=CD)
    assert s.ok and s.value == 0.0 and s.info["reason"] == "no expression found"


def test_countdown_missing_fields_raise_naming_key():
    with pytest.raises(KeyError, match=r"example 'p7' has no fields\['target'\]"):
        judge("countdown", "1+2", fields={"numbers": [1, 2]})


def test_to_number_values_and_what_it_keeps():
    """Exact values for each written form; short texts are cached (the same Fraction comes
    back), a text longer than 64 characters is parsed each time and never kept."""
    from fractions import Fraction

    from reroll.verifiers import answers

    cases = {"-1,000.5": Fraction(-2001, 2), "3/4": Fraction(3, 4), "2.5e3": Fraction(2500),
             "50%": Fraction(1, 2), "50\\%": Fraction(1, 2), "$ 12": Fraction(12),
             "x": None, "1/0": None, "": None}
    for text, want in cases.items():
        assert answers.to_number(text) == want, text
    assert answers.to_number("7/8") is answers.to_number("7/8")  # cached
    long = "1" * 65
    before = answers._cached_number.cache_info().currsize
    assert answers.to_number(long) == Fraction(int(long))
    assert answers._cached_number.cache_info().currsize == before  # not kept

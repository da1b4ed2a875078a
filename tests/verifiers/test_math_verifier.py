"""The math verifier: equivalence through math-verify, answer extraction, wrong vs malformed."""

import pytest

from reroll.rollout import Example, Rollout
from reroll.verifiers import VERIFIERS
from reroll.verifiers.extract import extract


def judge(gold: str, completion: str, **args):
    v = VERIFIERS.get("math")(**args)
    return v(Rollout("p", "g", [0], 0, completion=completion), Example("p", "q", gold))


# (reference answer, completion, expected value)
CASES = [
    # fractions and LaTeX \frac
    ("1/3", r"so \boxed{\frac{1}{3}}", 1.0),
    (r"\frac{1}{2}", "The answer is 0.5", 1.0),
    ("0.5", r"\boxed{\dfrac{1}{2}}", 1.0),
    (r"\frac{3}{4}", "Answer: 0.75", 1.0),
    ("1/2", r"\boxed{2/4}", 1.0),
    (r"\frac{2}{3}", r"\boxed{2/3}", 1.0),
    ("0.1", r"\boxed{\frac{1}{10}}", 1.0),
    # close-looking wrong answers: 0.33 and 0.333 are not 1/3 (6-digit rounding: 0.333333 is)
    ("1/3", r"\boxed{0.33}", 0.0),
    ("1/3", r"\boxed{0.333}", 0.0),
    ("1/3", r"\boxed{0.333333}", 1.0),
    # decimals, integers, thousands separators, signs
    ("2.5", r"\boxed{2.50}", 1.0),
    ("2.5", r"\boxed{2.05}", 0.0),
    ("10", r"\boxed{10.0}", 1.0),
    ("1000", r"\boxed{1,000}", 1.0),
    ("-3", r"\boxed{3}", 0.0),
    ("-3", r"x + 3 = 0 gives \boxed{-3}", 1.0),
    # intervals: open/closed ends matter
    ("(1,2]", r"\boxed{(1, 2]}", 1.0),
    ("(1,2]", r"\boxed{[1,2]}", 0.0),
    ("[1,2)", r"\boxed{[1,2]}", 0.0),
    (r"(-\infty, 3)", r"\boxed{(-\infty,3)}", 1.0),
    # sets: order does not matter, members do
    (r"\{1,2,3\}", r"\boxed{\{3,2,1\}}", 1.0),
    (r"\{1,2,3\}", r"\boxed{\{1,2\}}", 0.0),
    # percentages: 50% is 0.5, not 0.05
    (r"50\%", r"\boxed{0.5}", 1.0),
    (r"50\%", r"\boxed{0.05}", 0.0),
    (r"12\%", "The answer is 12%.", 1.0),
    # radicals, constants, expressions
    (r"\sqrt{2}/2", r"\boxed{\frac{\sqrt{2}}{2}}", 1.0),
    (r"2\sqrt{3}", r"\boxed{\sqrt{12}}", 1.0),
    ("3.14159", r"\boxed{\pi}", 0.0),
    ("(x+1)^2", r"\boxed{x^2+2x+1}", 1.0),
    (r"\infty", r"\boxed{\infty}", 1.0),
    # equations and units around the value
    ("5", r"\boxed{x=5}", 1.0),
    ("7", r"there are \boxed{7 \text{ apples}}", 1.0),
    # extraction fallbacks: tags, last number
    (r"\frac{1}{3}", "<answer>1/3</answer>", 1.0),
    ("7", "so 3 + 4 = 7", 1.0),
    ("7", "I think 3 + 4 = 8", 0.0),
    # a tuple is ordered
    ("(1,2)", r"\boxed{(2,1)}", 0.0),
    ("3", r"\boxed{3, 4}", 0.0),
]


@pytest.mark.parametrize(("gold", "completion", "expected"), CASES)
def test_math_equivalence_matches_hand_judgement(gold, completion, expected):
    s = judge(gold, completion)
    assert s.ok and s.value == expected, (gold, completion, s.info)


def test_math_has_at_least_thirty_hand_written_cases():
    assert len(CASES) >= 30


def test_math_no_answer_is_zero_with_reason_not_error():
    s = judge("4", "I have no idea")
    assert s.ok and s.value == 0.0
    assert s.info["reason"] == "no answer found (extract=auto)" and s.info["parsed"] is None


def test_math_unclosed_box_is_a_malformed_answer_not_an_error():
    s = judge("4", r"\boxed{")
    assert s.ok and s.value == 0.0 and "no answer" in s.info["reason"]


def test_math_info_carries_parsed_answer_and_extraction_mode():
    s = judge("1/3", r"first \boxed{2} then \boxed{\frac{1}{3}}")
    assert s.value == 1.0 and s.info["parsed"] == r"\frac{1}{3}" and s.info["how"] == "boxed"


def test_math_wrong_answer_reason_names_both_sides():
    s = judge("1/3", r"\boxed{0.33}")
    assert s.value == 0.0 and "0.33" in s.info["reason"] and "not equivalent" in s.info["reason"]


def test_math_non_math_reference_compared_as_text():
    # a reference math-verify cannot parse at all falls back to normalised text equality
    s = judge("!!", "the answer is !!")
    assert s.ok and s.value == 1.0 and "compared as text" in s.info["reason"]


def test_math_extract_mode_boxed_ignores_bare_numbers():
    s = judge("7", "so 3 + 4 = 7", extract="boxed")
    assert s.value == 0.0 and s.info["reason"] == "no answer found (extract=boxed)"


def test_math_rejects_unknown_extract_mode_naming_it():
    with pytest.raises(ValueError, match="extract='last'"):
        VERIFIERS.get("math")(extract="last")


@pytest.mark.parametrize(("text", "mode", "found"), [
    (r"a \boxed{\frac{1}{\sqrt{2}}} b", "auto", (r"\frac{1}{\sqrt{2}}", "boxed")),
    ("<answer> 7 </answer>", "auto", ("7", "tags")),
    ("The answer is 42.", "auto", ("42", "answer")),
    (r"Final Answer: $\frac{1}{2}$", "auto", (r"\frac{1}{2}", "answer")),
    ("I answered 3 then 4", "auto", ("4", "last_number")),  # "answered" is not "answer:"
    ("cost 1,000.50 then -3/4", "last_number", ("-3/4", "last_number")),
    ("  x y  ", "none", ("x y", "none")),
    ("no digits", "auto", (None, "auto")),
])
def test_extract_modes_find_the_final_answer(text, mode, found):
    assert extract(text, mode) == found


@pytest.mark.parametrize("completion,expected", [
    (r"The total is \boxed{\$18.90}", 1.0),  # an escaped dollar sign is not part of the number
    (r"\boxed{\$18.90} dollars", 1.0),
    (r"\boxed{\$18.00}", 0.0),
])
def test_an_escaped_dollar_in_the_box_is_ignored(completion, expected):
    assert judge("18.90", completion).value == expected


@pytest.mark.parametrize("completion,expected", [
    # a box and a different stated final answer: not correct, whichever is right
    (r"so \boxed{12}. Final answer: 13", 0.0),
    (r"so \boxed{13}. Final answer: 12", 0.0),
    # the same answer boxed and stated (even the box inside the phrase): correct
    (r"so \boxed{13}. Final answer: 13", 1.0),
    (r"The answer is \boxed{13}.", 1.0),
    (r"The answer is \boxed{26/2}.", 1.0),
])
def test_a_boxed_answer_contradicted_by_the_stated_final_answer_is_not_correct(completion,
                                                                              expected):
    s = judge("13", completion)
    assert s.value == expected, s.info
    if expected == 0.0 and "12" in completion.split("Final answer:")[1]:
        assert "not both right" in s.info["reason"]

"""The code verifier: pass fraction over stdin/stdout and assert-style tests."""

import pytest

from reroll.rollout import Example, Rollout
from reroll.verifiers import VERIFIERS
from reroll.verifiers.code import extract_program

ARGS = {"cpu_s": 1, "wall_s": 2.0, "memory_mb": 256}
IO_TESTS = [{"input": "2 3\n", "output": "5\n"}, {"input": "10 -4\n", "output": "6"},
            {"input": "0 0\n", "output": "0\n"}, {"input": "7 8\n", "output": "15\n"}]


def judge(completion: str, tests, **limits):
    v = VERIFIERS.get("code")(**{**ARGS, **limits})
    return v(Rollout("p", "g", [0], 0, completion=completion),
             Example("c1", "add two ints", "", fields={"tests": tests}))


def fenced(src: str) -> str:
    return f"Here is my solution:\n```python\n{src}\n```\nDone."


def test_correct_program_passes_all_io_tests():
    s = judge(fenced("a, b = map(int, input().split())\nprint(a + b)"), IO_TESTS)
    assert s.value == 1.0 and s.info["reason"] == "4/4 tests passed"
    assert [t["passed"] for t in s.info["tests"]] == [True] * 4


def test_partly_wrong_program_scores_the_fraction_with_reasons():
    # max(a + b, 5): (2,3)->5 ok, (10,-4)->6 ok, (0,0)->5 wrong (want 0), (7,8)->15 ok: 3/4
    s = judge(fenced("a, b = map(int, input().split())\nprint(max(a + b, 5))"), IO_TESTS)
    assert s.value == 0.75
    assert s.info["tests"][2] == {"passed": False,
                                  "reason": "wrong output: got '5', expected '0'"}


def test_crashing_program_scores_zero_with_the_error():
    s = judge(fenced("print(1 / 0)"), IO_TESTS[:2])
    assert s.ok and s.value == 0.0
    assert s.info["tests"][0]["reason"] == "exit code 1: ZeroDivisionError: division by zero"


def test_hostile_program_is_a_low_score_not_an_error():
    # wall clock well above the CPU limit: on a loaded box a busy loop gets its 1 s of CPU
    # late, and the wall-clock limit must not be what stops it here
    s = judge(fenced("while True:\n    pass"), IO_TESTS[:1], wall_s=15.0)
    assert s.ok and s.value == 0.0 and "CPU time limit" in s.info["tests"][0]["reason"]


def test_assert_style_tests():
    prog = fenced("def add(a, b):\n    return a + b if a != 9 else 0")
    tests = ["assert add(1, 2) == 3", "assert add(-1, 1) == 0", "assert add(9, 1) == 10"]
    s = judge(prog, tests)
    # the third assertion fails: add(9, 1) returns 0
    assert s.value == pytest.approx(2 / 3)
    assert s.info["tests"][2]["passed"] is False and "AssertionError" in s.info["tests"][2]["reason"]


def test_early_exit_does_not_pass_assert_tests():
    s = judge(fenced("import sys\nsys.exit(0)"), ["assert False"])
    assert s.value == 0.0 and "exited before the test ran" in s.info["tests"][0]["reason"]


def test_dict_of_parallel_lists_is_accepted():
    s = judge("print(input().upper())", {"inputs": ["ab\n", "c\n"], "outputs": ["AB", "d"]})
    # whole completion is the program when there is no fence; 1 of 2 right
    assert s.value == 0.5


def test_no_program_is_zero():
    s = judge("   ", IO_TESTS[:1])
    assert s.ok and s.value == 0.0 and s.info["reason"] == "no program found"


def test_malformed_tests_raise_naming_example():
    with pytest.raises(ValueError, match=r"example 'c1' fields\['tests'\]\[0\]"):
        judge("print(1)", [42])
    with pytest.raises(ValueError, match="equal length"):
        judge("print(1)", {"inputs": ["1"], "outputs": []})


def test_extract_program_takes_the_last_fence():
    text = "```python\nprint(1)\n```\nbetter:\n```py\nprint(2)\n```"
    assert extract_program(text) == "print(2)"
    assert extract_program("print(3)") == "print(3)"


def test_code_limits_must_be_positive():
    with pytest.raises(ValueError, match="wall_s must be > 0"):
        VERIFIERS.get("code")(wall_s=0)

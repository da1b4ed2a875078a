"""The countdown_search verifier on hand-made traces: a correct trace accepted, a wrong
answer refused, an answer the trace does not support refused; every solver demo accepted."""

import pytest

from reroll.rollout import Example, Rollout
from reroll.tasks import TASKS
from reroll.verifiers import VERIFIERS

FIELDS = {"numbers": [3, 5, 2], "target": 13}
TRACE = ("5+3=8 [2 8]\n8+2=10\n8*2=16\n8-2=6\n8/2=4\n< [3 5 2]\n"
         "5*3=15 [2 15]\n15+2=17\n15*2=30\n15-2=13\n")


def judge(completion, fields=FIELDS, **args):
    score = VERIFIERS.get("countdown_search")(**args)(
        Rollout("p", "g", [0], 0, completion=completion), Example("p1", "q", "", fields=fields))
    return score.value, score.info["reason"]


def test_correct_trace_is_accepted():
    assert judge(TRACE + "#### 5*3=15,15-2=13") == (1.0, "reaches 13 using [2, 3, 5]")
    # text after the answer's line is not part of the answer
    assert judge(TRACE + "#### 5*3=15,15-2=13\nthat is all")[0] == 1.0
    # the compare form: each leaf line ends with " vs <target>"
    compared = "".join(line + (" vs 13" if "[" not in line and "<" not in line else "") + "\n"
                       for line in TRACE.splitlines())
    assert "15-2=13 vs 13\n" in compared and "5*3=15 [2 15]\n" in compared
    assert judge(compared + "#### 5*3=15,15-2=13") == (1.0, "reaches 13 using [2, 3, 5]")


@pytest.mark.parametrize("answer, reason", [
    ("5*3=15,15-2=14", "wrong arithmetic"),
    ("5+3=8,8*2=16", "not the target 13"),
    ("5*3=15", "leaves [2, 15]"),                      # a number left unused
    ("5+5=10,10+3=13", "not available"),               # 5 used twice
    ("5-8=-3", "is not 'a op b=c'"),
    ("15-2=13", "not available"),                      # 15 is not given
    ("", "not the target"),
])
def test_wrong_answer_is_refused(answer, reason):
    value, why = judge(TRACE + "#### " + answer)
    assert value == 0.0 and reason in why


def test_no_answer_marker_is_refused():
    assert judge(TRACE) == (0.0, "no answer after '####'")


@pytest.mark.parametrize("trace", [
    "5+3=8 [2 8]\n8+2=10\n< [3 5 2]\n",                   # never reached: a guess
    "5+3=8 [2 8]\n15-2=13\n",                           # the leaf sits on another branch
    "5*3=15 [2 14]\n15-2=13\n",                         # the node lists the wrong numbers
    "15-2=13\n5*3=15 [2 15]\n",                         # the leaf comes before its node
    "5*3=15 [2 15] ok\n15-2=13\n",                      # malformed node line: no branch
    "5*3=15 [2 15] vs 13\n15-2=13\n",                   # a node has no comparison
])
def test_answer_the_trace_does_not_support_is_refused(trace):
    completion = trace + "#### 5*3=15,15-2=13"
    assert judge(completion) == (0.0, "the trace does not reach this answer")
    assert judge(completion, require_support=False)[0] == 1.0  # the answer itself is right


@pytest.mark.parametrize("args", [dict(order="random"),
                                  dict(numbers=4, max_number=8, max_value=30)])
def test_every_solver_demo_is_accepted_and_another_answer_is_not(args):
    task = TASKS.get("countdown_search")(0, n_train=200, n_test=0, **args)
    for ex in task.train:
        assert judge(ex.demo, fields=ex.fields)[0] == 1.0, ex.demo
    # a correct answer, but not the one this trace reached
    other = {"numbers": [3, 5, 2], "target": 16}
    assert judge("5*3=15 [2 15]\n15+2=17\n#### 5+3=8,8*2=16", fields=other) == (
        0.0, "the trace does not reach this answer")

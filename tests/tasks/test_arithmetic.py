"""The arithmetic task: hand-checked answers, seeded determinism, disjoint splits, limits."""

import re

import pytest

from reroll.models.tiny import CHARSET
from reroll.registry import RegistryError
from reroll.tasks import TASKS, TaskError
from reroll.tasks.arithmetic import decode, make_example, space_size


def build(seed=0, **kw):
    return TASKS.get("arithmetic")(seed, **kw)


def test_hand_checked_answers():
    assert make_example("37+45").answer == "82"  # 37 + 45 = 82
    assert make_example("37+45").prompt == "37+45="
    assert make_example("37+45").demo == "82"
    assert make_example("3+4*5").answer == "23"  # * first: 4*5 = 20, 3 + 20 = 23
    assert make_example("12-30").answer == "-18"  # 12 - 30 = -18
    assert make_example("9*9-80").answer == "1"  # 81 - 80 = 1


def test_space_size_and_decode_by_hand():
    assert space_size(2, "+", 2) == 10_000  # 100 * 100 operand pairs, one operator
    assert space_size(1, "+-*", 3) == 9_000  # 10**3 operand triples * 3**2 operator pairs
    # digits=1, ops "+-": index 123 -> n0 = 123 % 10 = 3, n1 = 12 % 10 = 2, op = 1 % 2 -> "-"
    assert decode(123, 1, "+-", 2) == "3-2"
    assert decode(0, 2, "+", 2) == "0+0"


def test_same_seed_same_problems_different_seed_different():
    a, b, c = (build(s, n_train=300, n_test=50) for s in (7, 7, 8))
    assert a.train == b.train and a.test == b.test
    assert [e.prompt for e in a.train] != [e.prompt for e in c.train]


def test_train_and_test_are_disjoint_and_unique():
    task = build(3, digits=2, ops="+-", n_train=2000, n_test=300)
    train = {e.prompt for e in task.train}
    test = {e.prompt for e in task.test}
    assert len(train) == 2000 and len(test) == 300
    assert not train & test
    assert len({e.prompt_id for e in task.train + task.test}) == 2300


def test_every_answer_matches_a_left_to_right_fold():
    # with only + and - the value is the left-to-right fold, computed here independently
    task = build(1, digits=3, ops="+-", operands=3, n_train=200, n_test=20)
    for ex in task.train + task.test:
        nums = [int(n) for n in re.findall(r"\d+", ex.prompt)]
        ops = re.findall(r"[+-]", ex.prompt)
        assert len(nums) == 3 and all(n < 1000 for n in nums)
        value = nums[0]
        for op, n in zip(ops, nums[1:], strict=True):
            value = value + n if op == "+" else value - n
        assert ex.answer == str(value) == ex.demo
        assert ex.prompt.endswith("=")


def test_prompts_fit_the_char_tokenizer():
    task = build(0, digits=3, ops="+-*", operands=3, n_train=100, n_test=10)
    assert all(set(e.prompt + e.answer) <= set(CHARSET) for e in task.train + task.test)
    assert task.verifier == {"name": "numeric", "args": {}}


def test_small_space_caps_train_and_covers_every_problem():
    # digits=1, ops "+", 2 operands: 10 * 10 = 100 problems; 10 go to test, 90 left for train
    with pytest.warns(UserWarning, match="train capped at 90"):
        task = build(0, digits=1, n_train=1000, n_test=10)
    assert len(task.train) == 90 and len(task.test) == 10
    assert {e.prompt for e in task.train + task.test} == {f"{a}+{b}=" for a in range(10)
                                                          for b in range(10)}


def test_default_hyperparameters_build_within_the_space():
    with pytest.warns(UserWarning, match="only 10000 distinct problems"):
        task = build(0)
    assert len(task.train) == 9500 and len(task.test) == 500


def test_test_set_larger_than_space_is_an_error():
    with pytest.raises(TaskError, match="only 100 distinct problems"):
        build(0, digits=1, n_train=5, n_test=100)


@pytest.mark.parametrize("kw, word", [({"ops": "/"}, "ops"), ({"ops": ""}, "ops"),
                                      ({"digits": 0}, "digits"), ({"operands": 1}, "operands"),
                                      ({"n_train": 0}, "n_train")])
def test_bad_hyperparameters_name_the_key(kw, word):
    with pytest.raises(TaskError, match=word):
        build(0, **{"n_train": 10, "n_test": 2, **kw})


def test_registry_checks_keyword_hyperparameters():
    TASKS.check_kwargs("arithmetic", {"digits": 3, "ops": "+-"})
    with pytest.raises(RegistryError, match="digit"):
        TASKS.check_kwargs("arithmetic", {"digit": 3})


def test_huge_space_samples_distinct_problems_deterministically():
    # 30 digits, 3 operands: (10**30)**3 * 2**2 = 4e90 problems, beyond random.sample's range
    a, b = (build(4, digits=30, ops="+-", operands=3, n_train=50, n_test=5) for _ in range(2))
    assert a.train == b.train and a.test == b.test
    assert len({e.prompt for e in a.train + a.test}) == 55
    ex = a.train[0]
    nums = [int(n) for n in re.findall(r"\d+", ex.prompt)]
    ops = re.findall(r"[+-]", ex.prompt)
    value = nums[0] + sum(n if op == "+" else -n for op, n in zip(ops, nums[1:], strict=True))
    assert ex.answer == str(value)  # exact big-integer arithmetic, no float rounding

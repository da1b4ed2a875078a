"""The arith_mixed task: hand-checked examples, levels by construction, exact per-level counts,
seeded determinism, disjoint splits, an interleaved test split, limits and clear errors."""

import re
import warnings
from collections import Counter

import pytest

from reroll.models.tiny import CHARSET
from reroll.registry import RegistryError
from reroll.tasks import TASKS, TaskError
from reroll.tasks.mixed import LEVELS, apportion, level_pool, mixed_example


def build(seed=0, **kw):
    return TASKS.get("arith_mixed")(seed, **kw)


def levels(examples):
    return Counter(e.fields["difficulty"] for e in examples)


def fold(prompt):
    """The value of a +/- expression as a left-to-right fold, computed independently."""
    nums = [int(n) for n in re.findall(r"\d+", prompt)]
    value = nums[0]
    for op, n in zip(re.findall(r"[+-]", prompt), nums[1:], strict=True):
        value = value + n if op == "+" else value - n
    return value


def test_hand_checked_examples():
    ex = mixed_example("37+5", "easy")
    assert (ex.prompt, ex.answer, ex.demo) == ("37+5=", "42", "42")  # 37 + 5 = 42
    assert ex.prompt_id == "arith_mixed:37+5" and ex.fields == {"difficulty": "easy"}
    assert mixed_example("12-30", "medium").answer == "-18"  # 12 - 30 = -18
    assert mixed_example("37-45+12", "hard").answer == "4"  # 37 - 45 = -8, -8 + 12 = 4
    assert mixed_example("5-99-98", "hard").answer == "-192"  # the longest answers: 4 chars


def test_level_sizes_by_hand():
    # easy: pairs below 100 with at least one operand below 10: 100 * 100 - 90 * 90 = 1900
    assert len(level_pool(LEVELS["easy"])) == 1900
    # medium: both operands in [10, 100), + or -: 90 * 90 * 2 = 16200
    assert len(level_pool(LEVELS["medium"])) == 16200
    assert level_pool(LEVELS["hard"]) is None  # every 3-operand +/- problem: 100**3 * 2**2


def test_apportion_by_hand():
    # 10 / 3 = 3.33 each: floors 3, 3, 3, the one left goes to the first of the tied remainders
    assert apportion(10, {"easy": 1, "medium": 1, "hard": 1}) == {"easy": 4, "medium": 3,
                                                                  "hard": 3}
    # 7 * 2/3 = 4.67, 7 * 1/3 = 2.33: floors 4, 2, 0; the one left to the larger remainder
    assert apportion(7, {"easy": 2, "medium": 1, "hard": 0}) == {"easy": 5, "medium": 2,
                                                                 "hard": 0}
    assert apportion(0, {"easy": 1, "medium": 1, "hard": 1}) == {"easy": 0, "medium": 0,
                                                                 "hard": 0}


def test_exact_counts_per_level():
    task = build(0, easy=2.0, medium=1.0, hard=1.0, n_train=1000, n_test=100)
    assert levels(task.train) == {"easy": 500, "medium": 250, "hard": 250}
    assert levels(task.test) == {"easy": 50, "medium": 25, "hard": 25}
    task = build(0, n_train=11, n_test=10)  # equal weights: 4, 4, 3 and 4, 3, 3
    assert levels(task.train) == {"easy": 4, "medium": 4, "hard": 3}
    assert levels(task.test) == {"easy": 4, "medium": 3, "hard": 3}
    task = build(0, easy=0.0, medium=1.0, hard=3.0, n_train=400, n_test=40)
    assert levels(task.train) == {"medium": 100, "hard": 300}
    assert levels(task.test) == {"medium": 10, "hard": 30}


def test_every_example_belongs_to_its_level_and_is_right():
    task = build(5, n_train=900, n_test=90)
    for ex in task.train + task.test:
        nums = [int(n) for n in re.findall(r"\d+", ex.prompt)]
        ops = re.findall(r"[+-]", ex.prompt)
        level = ex.fields["difficulty"]
        assert all(0 <= n < 100 for n in nums)
        if level == "easy":
            assert len(nums) == 2 and ops == ["+"] and min(nums) < 10
        elif level == "medium":
            assert len(nums) == 2 and len(ops) == 1 and min(nums) >= 10
        else:
            assert level == "hard" and len(nums) == 3 and len(ops) == 2
        assert ex.answer == str(fold(ex.prompt)) == ex.demo
        assert len(ex.answer) <= 4 and ex.prompt.endswith("=")
        assert ex.prompt_id == "arith_mixed:" + ex.prompt[:-1]
        assert set(ex.prompt + ex.answer) <= set(CHARSET)
    assert task.verifier == {"name": "numeric", "args": {}}
    # both operators turn up in medium and hard, and both orders of a one-digit operand in easy
    assert {re.findall(r"[+-]", e.prompt)[0] for e in task.train
            if e.fields["difficulty"] == "medium"} == {"+", "-"}
    easy = [[int(n) for n in re.findall(r"\d+", e.prompt)] for e in task.train
            if e.fields["difficulty"] == "easy"]
    assert any(a < 10 <= b for a, b in easy) and any(b < 10 <= a for a, b in easy)


def test_same_seed_same_problems_different_seed_different():
    a, b, c = (build(s, n_train=300, n_test=30) for s in (7, 7, 8))
    assert a.train == b.train and a.test == b.test
    assert [e.prompt for e in a.train] != [e.prompt for e in c.train]


def test_train_and_test_are_disjoint_and_unique():
    task = build(3, n_train=3000, n_test=300)
    train = {e.prompt for e in task.train}
    test = {e.prompt for e in task.test}
    assert len(train) == 3000 and len(test) == 300 and not train & test
    assert len({e.prompt_id for e in task.train + task.test}) == 3300


def test_every_prefix_of_the_test_split_keeps_the_proportions():
    task = build(1, easy=2.0, medium=1.0, hard=1.0, n_train=100, n_test=80)
    share = {"easy": 0.5, "medium": 0.25, "hard": 0.25}
    for m in range(1, 81):
        counts = levels(task.test[:m])
        assert all(abs(counts[k] - m * s) <= 1 for k, s in share.items()), (m, counts)
    # train is shuffled: its first 30 are not all of one level
    assert len(levels(task.train[:30])) == 3


def test_defaults_fit_without_a_warning():
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        task = build(0)
    assert levels(task.train) == {"easy": 1500, "medium": 1500, "hard": 1500}
    assert levels(task.test) == {"easy": 100, "medium": 100, "hard": 100}


def test_small_level_caps_its_train_share_and_covers_its_space():
    # easy alone: 1900 problems, 100 go to test, 1800 left for train
    with pytest.warns(UserWarning, match="level 'easy'.*train share capped at 1800"):
        task = build(0, easy=1.0, medium=0.0, hard=0.0, n_train=5000, n_test=100)
    assert len(task.train) == 1800 and len(task.test) == 100
    assert {e.prompt for e in task.train + task.test} == {
        f"{a}+{b}=" for a in range(100) for b in range(100) if min(a, b) < 10}


def test_test_share_larger_than_a_level_is_an_error_naming_it():
    with pytest.raises(TaskError, match="level 'easy' has only 1900 distinct problems"):
        build(0, easy=1.0, medium=1.0, hard=0.0, n_train=10, n_test=3800)


@pytest.mark.parametrize("kw, word", [({"easy": -1.0}, "easy"), ({"medium": -0.5}, "medium"),
                                      ({"hard": -2.0}, "hard"),
                                      ({"easy": 0.0, "medium": 0.0, "hard": 0.0},
                                       "level weights"),
                                      ({"n_train": 0}, "n_train"), ({"n_test": -1}, "n_test")])
def test_bad_hyperparameters_name_the_key(kw, word):
    with pytest.raises(TaskError, match=word):
        build(0, **{"n_train": 10, "n_test": 2, **kw})


def test_registry_checks_keyword_hyperparameters():
    TASKS.check_kwargs("arith_mixed", {"easy": 2.0, "hard": 0.0, "n_test": 50})
    with pytest.raises(RegistryError, match="medium"):
        TASKS.check_kwargs("arith_mixed", {"medum": 1.0})
    with pytest.raises(RegistryError, match="hard"):
        TASKS.check_kwargs("arith_mixed", {"hard": -1.0})



def test_train_subset_keeps_the_test_split_and_each_levels_first_prompts():
    import random

    from reroll.tasks.mixed import _distinct_indices, space_size

    full, sub = build(0), build(0, train_subset=30)
    assert [e.prompt for e in sub.test] == [e.prompt for e in full.test]  # same held-out set
    assert levels(sub.train) == {"easy": 10, "medium": 10, "hard": 10}  # apportioned
    for name, lv in LEVELS.items():  # each level's first 10 draws (its draw order, recomputed)
        pool = level_pool(lv)
        size = space_size(lv.digits, lv.ops, lv.operands) if pool is None else len(pool)
        picks = _distinct_indices(random.Random(f"0:{name}"), size, 1600)[:10]
        first = {mixed_example(lv.expression(i if pool is None else pool[i]), name, "").prompt
                 for i in picks}
        assert {e.prompt for e in sub.train if e.fields["difficulty"] == name} == first
    with pytest.raises(TaskError, match="train_subset"):
        build(0, n_train=10, n_test=2, train_subset=11)

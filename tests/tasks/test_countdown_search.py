"""The countdown_search task: the solver's written-out search on hand-checked cases, seeded
and disjoint splits, and demo lengths as the difficulty parameters say (no timing)."""

import re
import statistics

import pytest

from reroll.models.tiny import CHARSET
from reroll.tasks import TASKS, TaskError
from reroll.tasks.countdown_search import search, write_demo


def build(seed=0, **kw):
    return TASKS.get("countdown_search")(seed, **kw)


def demo_of(numbers, target):
    lines, path = search(numbers, target)
    return None if path is None else write_demo(lines, path)


def demo_of_capped(numbers, target, max_value):
    lines, path = search(numbers, target, max_value=max_value)
    return None if path is None else write_demo(lines, path)


def test_first_branch_solves():
    assert demo_of([3, 5, 2], 16) == "5+3=8 [2 8]\n8+2=10\n8*2=16\n#### 5+3=8,8*2=16"


def test_compare_ends_each_leaf_with_the_target():
    lines, path = search([3, 5, 2], 13, compare=True)
    assert write_demo(lines, path) == (
        "5+3=8 [2 8]\n8+2=10 vs 13\n8*2=16 vs 13\n8-2=6 vs 13\n8/2=4 vs 13\n< [3 5 2]\n"
        "5*3=15 [2 15]\n15+2=17 vs 13\n15*2=30 vs 13\n15-2=13 vs 13\n#### 5*3=15,15-2=13")
    # the task's default writes it; compare=False is the bare form above
    ex = build(numbers=3, max_number=12, n_train=5, n_test=0).train[0]
    assert " vs " in ex.demo
    assert " vs " not in build(numbers=3, max_number=12, n_train=5, n_test=0,
                               compare=False).train[0].demo


def test_dead_end_then_backtrack():
    assert demo_of([3, 5, 2], 13) == (
        "5+3=8 [2 8]\n8+2=10\n8*2=16\n8-2=6\n8/2=4\n< [3 5 2]\n"
        "5*3=15 [2 15]\n15+2=17\n15*2=30\n15-2=13\n#### 5*3=15,15-2=13")


def test_a_search_stops_once_its_trace_is_longer_than_max_chars():
    # the dead-end search above: ten lines, 76 characters and 9 newlines = 85
    full, path = search([3, 5, 2], 13)
    assert len("\n".join(full)) == 85 and path == ["5*3=15", "15-2=13"]
    assert search([3, 5, 2], 13, max_chars=85) == (full, path)  # exactly at the budget
    assert search([3, 5, 2], 13, max_chars=84) == (full, None)  # its last line is one over
    # 11, then 11 + 1 + 6 = 18, then 25 > 20: stopped after the third line
    assert search([3, 5, 2], 13, max_chars=20) == (full[:3], None)


def test_division_only_when_exact_and_subtraction_only_when_positive():
    assert demo_of([2, 2], 1) == "2+2=4\n2*2=4\n2/2=1\n#### 2/2=1"
    lines, path = search([3, 3], 7)  # 6, 9, (no 0), 1: never 7
    assert lines == ["3+3=6", "3*3=9", "3/3=1"] and path is None


def test_max_value_skips_the_tries_above_it():
    assert demo_of_capped([5, 2], 3, 6) == "5-2=3\n#### 5-2=3"  # 7 and 10 are not tried
    lines, path = search([3, 5, 2], 9, max_value=10)
    assert lines[:6] == ["5+3=8 [2 8]", "8+2=10", "8-2=6", "8/2=4", "< [3 5 2]",
                         "5-3=2 [2 2]"]  # 8*2=16 and 5*3=15 (with its subtree) skipped
    assert path == ["5-2=3", "3*3=9"]
    assert all(int(n) <= 10 for line in lines for n in re.findall(r"\d+", line))
    assert search([3, 5, 2], 13, max_value=10)[1] is None  # the target itself is above it
    task = build(0, n_train=200, n_test=20, numbers=4, max_number=8, max_value=30)
    for ex in task.train + task.test:
        assert all(int(n) <= 30 for n in re.findall(r"\d+", ex.demo))


def test_random_order_tries_the_same_moves_in_another_order():
    import random
    fixed, _ = search([4, 7, 9], 10**6)  # unreachable: the whole tree is written
    shuffled, _ = search([4, 7, 9], 10**6, random.Random(1))
    assert sorted(fixed) == sorted(shuffled) and fixed != shuffled


def test_seeded_disjoint_and_in_the_tiny_charset():
    a, b = build(0, n_train=300, n_test=50), build(0, n_train=300, n_test=50)
    assert [e.demo for e in a.train] == [e.demo for e in b.train]
    assert [e.prompt for e in build(1, n_train=300, n_test=50).train] != [
        e.prompt for e in a.train]
    key = lambda e: (tuple(sorted(e.fields["numbers"])), e.fields["target"])  # noqa: E731
    assert not {key(e) for e in a.train} & {key(e) for e in a.test}
    assert a.answer_marker == "####" and a.verifier["name"] == "countdown_search"
    for ex in a.train + a.test:
        assert set(ex.prompt + ex.demo) <= set(CHARSET)
        assert ex.demo.endswith("#### " + ex.answer)
        assert ex.prompt == " ".join(map(str, ex.fields["numbers"])) + f"->{ex.fields['target']}:"


def lengths(**kw):
    task = build(0, n_train=2000, n_test=0, **kw)
    return sorted(len(e.demo) for e in task.train)


def quantile(xs, q):
    return xs[int(q * len(xs))]


def test_default_lengths_long_tailed_with_some_at_512():
    xs = lengths()
    median = statistics.median(xs)
    assert median >= 64
    assert quantile(xs, 0.95) >= 3 * median
    assert any(x >= 512 for x in xs) and max(xs) <= 600  # max_demo caps the tail


def test_difficulty_parameters_set_the_lengths():
    # 2 numbers: one level of tries (at most + * - /, no inner node, no backtracking)
    for ex in build(numbers=2, max_number=50, n_train=200, n_test=0).train:
        trace = ex.demo.split("\n#### ")[0].splitlines()
        assert len(trace) <= 4 and not any("[" in line or "<" in line for line in trace)
    assert statistics.median(lengths(numbers=3, max_number=50)) >= 64
    small, large = lengths(max_number=10), lengths(max_number=40)
    assert statistics.median(small) < statistics.median(large)
    assert max(lengths(max_demo=200)) <= 200


@pytest.mark.parametrize("kw", [dict(numbers=5), dict(max_number=1), dict(order="bfs"),
                                dict(max_demo=8), dict(n_train=0), dict(max_value=-1)])
def test_bad_parameters_are_task_errors(kw):
    with pytest.raises(TaskError, match="countdown_search"):
        build(0, **kw)


def test_too_few_instances_is_a_task_error():
    with pytest.raises(TaskError, match="distinct instances"):
        build(0, numbers=2, max_number=3, n_train=100)


def test_the_search_stage_trains_on_no_problem_of_the_compare_test_split():
    """scripts/reasoning.sh's first SFT stage trains on the bare form's split (compare =
    false), whose instances differ from the compare form's (demo lengths decide which are
    kept): none of configs/reasoning.toml's test problems may be among them."""
    args = dict(numbers=4, max_number=8, max_value=30, max_demo=600, n_train=4000, n_test=200)
    bare = {ex.prompt for ex in build(compare=False, **args).train}
    test = [ex.prompt for ex in build(compare=True, **args).test]
    assert len(test) == 200 and not bare.intersection(test)

"""The countdown task: every instance solvable by its demo, seeded, disjoint, hand-checked."""

import random
import re

import pytest

from reroll.models.tiny import CHARSET
from reroll.tasks import TASKS, TaskError
from reroll.tasks.countdown import prompt_for, random_expression
from reroll.tasks.expr import parse


def build(seed=0, **kw):
    return TASKS.get("countdown")(seed, **kw)


def key(ex):
    return tuple(sorted(ex.fields["numbers"])), ex.fields["target"]


def test_prompt_format_is_short():
    assert prompt_for([3, 5, 2], 16) == "3 5 2->16:"


def test_random_expression_uses_each_number_once():
    rng = random.Random(0)
    for _ in range(200):
        nums = [rng.randint(1, 9) for _ in range(4)]
        text = random_expression(rng, nums)
        assert sorted(int(n) for n in re.findall(r"\d+", text)) == sorted(nums)
    # 2 numbers: a single bracket pair, stripped -> "a op b" with no brackets at all
    assert "(" not in random_expression(random.Random(3), [4, 6])


def test_every_demo_reaches_its_target_with_exactly_the_given_numbers():
    task = build(0, numbers=4, max_number=12, n_train=500, n_test=50)
    for ex in task.train + task.test:
        value, used = parse(ex.demo)
        assert value == ex.fields["target"] == int(ex.answer) > 0
        assert sorted(used) == sorted(ex.fields["numbers"])
        assert all(1 <= n <= 12 for n in ex.fields["numbers"])
        assert ex.prompt == prompt_for(ex.fields["numbers"], ex.fields["target"])


def test_two_numbers_up_to_two_give_exactly_seven_instances():
    # {1,1}: 1+1=2, 1*1=1/1=1, 1-1=0 dropped -> targets {1, 2}
    # {1,2}: 1+2=3, 2-1=1, 2*1=2/1=2, 1/2 dropped -> targets {1, 2, 3}
    # {2,2}: 2+2=2*2=4, 2/2=1, 2-2=0 dropped -> targets {1, 4}
    task = build(0, numbers=2, max_number=2, n_train=6, n_test=1)
    assert {key(e) for e in task.train + task.test} == {
        ((1, 1), 1), ((1, 1), 2), ((1, 2), 1), ((1, 2), 2), ((1, 2), 3), ((2, 2), 1), ((2, 2), 4)
    }
    with pytest.raises(TaskError, match="found only 7 distinct instances"):
        build(0, numbers=2, max_number=2, n_train=7, n_test=1)


def test_same_seed_same_instances_different_seed_different():
    a, b, c = (build(s, n_train=300, n_test=30) for s in (1, 1, 2))
    assert a.train == b.train and a.test == b.test
    assert [e.prompt for e in a.train] != [e.prompt for e in c.train]


def test_no_test_instance_appears_in_train_even_reordered():
    task = build(5, n_train=1500, n_test=200)
    train = {key(e) for e in task.train}
    test = {key(e) for e in task.test}
    assert len(train) == 1500 and len(test) == 200
    assert not train & test


def test_defaults_build_and_fit_the_char_tokenizer():
    task = build(0)
    assert len(task.train) == 2000 and len(task.test) == 200
    assert task.verifier == {"name": "countdown", "args": {}}
    assert all(set(e.prompt + e.demo) <= set(CHARSET) for e in task.train)
    assert max(len(e.prompt) for e in task.train) <= 16  # "10 10 10->1000:" is 15 chars


@pytest.mark.parametrize("kw, word", [({"numbers": 1}, "numbers"),
                                      ({"max_number": 0}, "max_number"),
                                      ({"n_test": -1}, "n_test")])
def test_bad_hyperparameters_name_the_key(kw, word):
    with pytest.raises(TaskError, match=word):
        build(0, **{"n_train": 10, "n_test": 2, **kw})

"""The longtail task: hand-checked examples and count law, seeded determinism, disjoint splits,
a long-tailed length distribution, the exact verifier's verdicts, and clear errors."""

import pytest

from reroll.models.tiny import CHARSET
from reroll.registry import RegistryError
from reroll.rollout import Rollout
from reroll.tasks import TASKS, TaskError
from reroll.tasks.longtail import LETTERS, held_out_letters, make_example, pareto_count
from reroll.verifiers import VERIFIERS


def build(seed=0, **kw):
    return TASKS.get("longtail")(seed, **kw)


def test_hand_checked_example():
    ex = make_example("x", 5, "id0")
    assert ex.prompt == "x*5=" and ex.answer == "xxxxx" and ex.demo == "xxxxx"
    assert len(make_example("Q", 23, "id1").answer) == 23


def test_pareto_count_by_hand():
    law = dict(min_count=2, max_count=31, alpha=1.0)
    assert pareto_count(1.0, **law) == 2  # 2 * 1**-1 = 2
    assert pareto_count(0.5, **law) == 4  # 2 * 0.5**-1 = 4
    assert pareto_count(0.3, **law) == 6  # 2 / 0.3 = 6.67 -> floor 6
    assert pareto_count(0.01, **law) == 31  # 2 / 0.01 = 200 -> capped at 31
    # alpha 2: 2 * 0.25**-0.5 = 2 * 2 = 4
    assert pareto_count(0.25, min_count=2, max_count=31, alpha=2.0) == 4
    with pytest.raises(ValueError, match="u must be in"):
        pareto_count(0.0, **law)


def test_same_seed_same_problems_different_seed_different():
    a, b, c = (build(s, n_train=300, n_test=50) for s in (7, 7, 8))
    assert a.train == b.train and a.test == b.test
    assert [e.prompt for e in a.train] != [e.prompt for e in c.train]


def test_train_and_test_prompts_are_disjoint_and_ids_unique():
    task = build(3, n_train=3000, n_test=400)
    assert len(task.train) == 3000 and len(task.test) == 400
    assert not {e.prompt for e in task.train} & {e.prompt for e in task.test}
    assert len({e.prompt_id for e in task.train + task.test}) == 3400
    held = held_out_letters(3, 31, 10)
    assert all(len(h) == 10 for h in held.values())  # 10 of 52 letters per count
    for e in task.test:
        letter, count = e.prompt[0], int(e.prompt[2:-1])
        assert letter in held[count]


def test_lengths_follow_the_capped_pareto_law():
    task = build(0, n_train=20000, min_count=2, max_count=31, alpha=1.0)
    lens = [len(e.answer) for e in task.train]
    n = len(lens)
    assert min(lens) == 2 and max(lens) == 31
    # P(count >= c) = 2 / c: >= 4 is 0.5, >= 8 is 0.25; the cap holds P(>= 31) = 2/31 = 0.0645
    assert abs(sum(x >= 4 for x in lens) / n - 0.5) < 0.02
    assert abs(sum(x >= 8 for x in lens) / n - 0.25) < 0.02
    assert abs(sum(x == 31 for x in lens) / n - 2 / 31) < 0.01
    # long tail: the median is 4 (P(>=4) = 0.5) while the longest responses are 31
    assert sorted(lens)[n // 2] in (3, 4)


def test_every_example_is_consistent_and_uses_tokenizer_characters():
    for e in build(1, n_train=500, n_test=100).train:
        letter, count = e.prompt[0], int(e.prompt[2:-1])
        assert e.prompt == f"{letter}*{count}=" and e.answer == letter * count
        assert letter in LETTERS and set(e.prompt) <= set(CHARSET)


def test_default_verifier_is_case_sensitive_exact():
    task = build(0, n_train=10, n_test=0)
    spec = task.verifier
    v = VERIFIERS.get(spec["name"])(**spec["args"])
    ex = make_example("a", 3, "id")

    def score(text):
        r = Rollout(prompt_id="id", group_id="g", tokens=[], prompt_len=0, completion=text)
        return v(r, ex).value

    assert score("aaa") == 1.0
    assert score("aa") == 0.0  # one short
    assert score("aaaa") == 0.0  # one long
    assert score("AAA") == 0.0  # another letter


def test_bad_hyperparameters_are_named():
    with pytest.raises(TaskError, match="max_count must be >= min_count=5"):
        build(max_count=4, min_count=5)
    with pytest.raises(TaskError, match="alpha must be > 0"):
        build(alpha=0)
    with pytest.raises(TaskError, match="test_letters"):
        build(test_letters=52)
    with pytest.raises(RegistryError, match="no hyperparameter .max_len."):
        TASKS.check_kwargs("longtail", {"max_len": 3}, "task.args")

"""DAPO's zero-variance group filter."""

import pytest

from reroll.control import FILTERS


def test_zero_variance_drops_all_equal_groups_and_keeps_singletons():
    decide = FILTERS.get("zero_variance")
    groups = [[1, 1, 1], [0, 0, 0, 0], [1, 0, 1], [1], [0.5, 0.5000001], []]
    # all correct / all wrong -> no spread -> dropped ; mixed -> kept ; a singleton is kept
    # (its spread is undefined); a 1e-7 spread is > tol 0 -> kept ; an empty group is dropped
    assert decide(groups) == ["zero_variance", "zero_variance", None, None, None, "empty_group"]


def test_zero_variance_tolerance():
    decide = FILTERS.bind("zero_variance", {"tol": 0.01})
    assert decide([[0.5, 0.505], [0.5, 0.52]]) == ["zero_variance", None]  # spreads .005, .02


def test_zero_variance_rejects_nan_and_negative_tol():
    with pytest.raises(ValueError, match="group 1 has a NaN"):
        FILTERS.get("zero_variance")([[1, 0], [float("nan"), 1]])
    with pytest.raises(KeyError, match=r"'tol' must be in \[0, inf\), got -1"):
        FILTERS.bind("zero_variance", {"tol": -1})
    with pytest.raises(ValueError, match="tol must be >= 0"):
        FILTERS.get("zero_variance")([[1]], tol=-1)


def test_dynamic_sampling_filters_on_the_combined_reward_not_the_first_score():
    from reroll.build_rollout import build_filters
    from reroll.config_checks import load_checked
    from reroll.rollout import Example, SamplingParams, Score, new_group

    cfg = load_checked(None, ["algo.dynamic_sampling=true"])

    def combine(scores):  # 0.1 * format + 1.0 * correct
        return 0.1 * scores[0].value + scores[1].value

    (keep_if_varied,) = build_filters(cfg, combine)
    g = new_group(Example("p", "1+1=", "2"), 3, [1], SamplingParams(), 0)
    # the format check (listed first) passes for all three; correctness varies: keep
    for r, ok in zip(g.rollouts, [1.0, 0.0, 1.0]):
        r.scores = [Score("format", value=1.0), Score("exact", value=ok)]
    assert keep_if_varied(g) is None
    # correctness all 0 while the format varies: combined 0.1, 0.0, 0.1 still varies: keep
    for r, fmt in zip(g.rollouts, [1.0, 0.0, 1.0]):
        r.scores = [Score("format", value=fmt), Score("exact", value=0.0)]
    assert keep_if_varied(g) is None
    # everything equal: drop
    for r in g.rollouts:
        r.scores = [Score("format", value=1.0), Score("exact", value=0.0)]
    assert keep_if_varied(g) == "zero_variance"

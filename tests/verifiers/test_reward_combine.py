"""Reward composition: weighted sums by hand, unique names, errors propagate as None."""

import pytest

from reroll.registry import RegistryError
from reroll.rollout import Example, Rollout, Score
from reroll.verifiers import VERIFIERS, build_reward

EX = Example("p", "q", "1/2", fields={"numbers": [1, 2], "target": 3})


def rollout(text: str) -> Rollout:
    return Rollout("p", "g", [0], 0, completion=text)


def test_empty_specs_use_the_task_default_with_weight_one():
    r = build_reward([], {"name": "math"})
    assert r.names == ["math"] and r.weights == {"math": 1.0}
    scores = r(rollout(r"\boxed{0.5}"), EX)
    assert r.combine(scores) == 1.0


def test_weighted_sum_computed_by_hand():
    r = build_reward([{"name": "math", "weight": 1.0},
                      {"name": "format", "weight": 0.5,
                       "args": {"pattern": r"<answer>.*</answer>"}}], {"name": "exact"})
    # right answer, right format: 1*1 + 0.5*1 = 1.5
    assert r.combine(r(rollout("<answer>1/2</answer>"), EX)) == 1.5
    # right answer, wrong format: 1*1 + 0.5*0 = 1.0
    assert r.combine(r(rollout(r"\boxed{1/2}"), EX)) == 1.0
    # wrong answer, right format: 1*0 + 0.5*1 = 0.5
    assert r.combine(r(rollout("<answer>1/3</answer>"), EX)) == 0.5


def test_components_stay_visible_with_unique_names():
    r = build_reward([{"name": "format"}, {"name": "format", "weight": -1.0,
                                          "args": {"pattern": "x", "fullmatch": False}},
                      {"name": "format"}], {"name": "math"})
    assert r.names == ["format", "format_2", "format_3"]
    scores = r(rollout("x"), EX)
    assert [s.name for s in scores] == ["format", "format_2", "format_3"]
    # default pattern fails on "x" (0), "x" search passes (1) with weight -1: 0 - 1 + 0 = -1
    assert [s.value for s in scores] == [0.0, 1.0, 0.0] and r.combine(scores) == -1.0


def test_a_raising_verifier_is_an_error_score_and_combine_is_none():
    r = build_reward([{"name": "numeric"}, {"name": "math"}], {"name": "math"})
    bad = Example("p", "q", "not-a-number")
    scores = r(rollout("5"), bad)
    assert not scores[0].ok and scores[0].error.startswith("verifier 'numeric' raised ValueError")
    assert scores[1].ok  # other components still run
    assert r.combine(scores) is None


def test_combine_requires_every_component():
    r = build_reward([{"name": "math"}, {"name": "exact"}], {})
    with pytest.raises(ValueError, match=r"lack reward component\(s\) \['exact'\]"):
        r.combine([Score("math", value=1.0)])


def test_scores_record_latency():
    r = build_reward([], {"name": "countdown"})
    (s,) = r(rollout("1 + 2"), EX)
    assert s.value == 1.0 and s.latency_s > 0.0


def test_bad_specs_name_their_position():
    with pytest.raises(RegistryError, match=r"unknown verifier 'maht'.*did you mean 'math'"):
        build_reward([{"name": "maht"}], {})
    with pytest.raises(RegistryError, match=r"no hyperparameter 'tol'.*reward.verifiers\[1\]"):
        build_reward([{"name": "math"}, {"name": "numeric", "args": {"tol": 1}}], {})
    with pytest.raises(ValueError, match=r"reward.verifiers\[0\]: expects keys name, weight"):
        build_reward([{"name": "math", "wieght": 2}], {})
    with pytest.raises(ValueError, match=r"reward.verifiers\[0\]: weight must be a finite"):
        build_reward([{"name": "math", "weight": "heavy"}], {})
    with pytest.raises(ValueError, match=r"reward.verifiers\[0\]: verifier 'format': pattern"):
        build_reward([{"name": "format", "args": {"pattern": "("}}], {})


def test_every_registered_verifier_has_keyword_only_hyperparameters():
    import inspect

    for name in VERIFIERS.names():
        params = inspect.signature(VERIFIERS.get(name)).parameters.values()
        assert all(p.kind is p.KEYWORD_ONLY for p in params), name

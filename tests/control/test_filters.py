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
    with pytest.raises(ValueError, match="tol must be >= 0"):
        FILTERS.bind("zero_variance", {"tol": -1})([[1]])

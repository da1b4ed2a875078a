"""task.train_limit: the run trains on the first N train examples, the test split stays the
task's own, and a limit above the split is refused naming the key."""

import pytest

from reroll import build
from reroll.config_checks import load_checked
from reroll.errors import ConfigError


def _task(*overrides):
    return build.build_task(load_checked(None, ["task.name=arithmetic", *overrides]))


def test_the_train_split_is_cut_to_its_first_examples_and_the_test_split_kept():
    full, cut = _task(), _task("task.train_limit=7")
    assert len(full.train) > 7
    assert [e.prompt for e in cut.train] == [e.prompt for e in full.train[:7]]
    assert [e.answer for e in cut.train] == [e.answer for e in full.train[:7]]
    assert [e.prompt for e in cut.test] == [e.prompt for e in full.test]
    assert cut.verifier == full.verifier


def test_a_limit_of_0_keeps_every_train_example():
    assert [e.prompt for e in _task("task.train_limit=0").train] == \
        [e.prompt for e in _task().train]


def test_a_limit_above_the_split_is_refused_naming_the_key():
    n = len(_task().train)
    with pytest.raises(ConfigError, match=rf"task.train_limit = {n + 1}.*has {n} train"):
        _task(f"task.train_limit={n + 1}")

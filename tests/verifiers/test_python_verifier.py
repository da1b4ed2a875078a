"""The python verifier: a user's TRL-style reward function by import path."""

import pytest

from reroll.rollout import Example, Rollout
from reroll.verifiers import VERIFIERS


def judge(fn: str, completion: str = "abc", answer: str = "abc", fields=None):
    v = VERIFIERS.get("python")(fn=fn)
    ex = Example("p1", "the prompt", answer, fields=fields or {"level": 2.0})
    return v(Rollout("p1", "g", [0], 0, completion=completion), ex)


def test_python_returns_the_functions_value(rewards_module):
    s = judge(f"{rewards_module}:length", completion="abcd")
    assert s.ok and s.value == 4.0 and s.info["applicable"] is True


def test_python_passes_answer_prompt_id_and_fields_as_lists(rewards_module):
    # completion == answer -> 1.0 * level 2.0 = 2.0; different -> 0.0
    assert judge(f"{rewards_module}:uses_fields", "x", "x").value == 2.0
    assert judge(f"{rewards_module}:uses_fields", "x", "y").value == 0.0


def test_python_none_means_not_applicable_stored_as_zero(rewards_module):
    s = judge(f"{rewards_module}:not_applicable")
    assert s.ok and s.value == 0.0 and s.info["applicable"] is False
    assert "not applicable" in s.info["reason"]


def test_python_exception_is_an_error_naming_the_function(rewards_module):
    s = judge(f"{rewards_module}:boom")
    assert not s.ok and s.value is None
    assert s.error == f"reward function {rewards_module}:boom raised RuntimeError: boom in reward"
    assert "RuntimeError" in s.info["traceback"]


def test_python_bad_return_shapes_are_errors(rewards_module):
    s = judge(f"{rewards_module}:wrong_length")
    assert not s.ok and "one value per completion" in s.error
    n = judge(f"{rewards_module}:nan")
    assert not n.ok and "expected a finite float or None" in n.error


def test_python_bad_paths_fail_at_build_with_the_path():
    with pytest.raises(ValueError, match="must look like 'pkg.module:function'"):
        VERIFIERS.get("python")(fn="no_colon")
    with pytest.raises(ValueError, match="cannot import module 'reroll_no_such_mod'"):
        VERIFIERS.get("python")(fn="reroll_no_such_mod:f")
    with pytest.raises(ValueError, match="module 'reroll.rollout' has no 'nope'"):
        VERIFIERS.get("python")(fn="reroll.rollout:nope")


def test_python_fn_is_a_required_hyperparameter():
    with pytest.raises(KeyError, match="needs hyperparameter"):
        VERIFIERS.check_kwargs("python", {})

"""What a user does by accident, from the adversarial pass counted in docs/faults.md: each
case here failed, misled or refused needlessly before its fix."""

import json

import pytest

from reroll.config import ConfigError, load_config
from reroll.rollout import Example, Rollout
from reroll.tasks.base import TaskError
from reroll.tasks.files import load_examples
from reroll.verifiers.user import PythonVerifier

ROWS = [{"id": "a", "prompt": "1+1=", "answer": "2"}, {"id": "b", "prompt": "2+2=", "answer": "4"}]
SPEC = {"prompt_field": "prompt", "answer_field": "answer", "demo_field": "", "id_field": "id",
        "prompt_template": "{prompt}"}


def test_a_dataset_saved_with_a_bom_loads_like_one_without(tmp_path):
    plain, bom = tmp_path / "plain.jsonl", tmp_path / "bom.jsonl"
    text = "".join(json.dumps(r) + "\r\n" for r in ROWS)  # a Windows editor: CRLF too
    plain.write_text(text, encoding="utf-8")
    bom.write_bytes(b"\xef\xbb\xbf" + text.encode())  # before: "line 1: invalid JSON"
    got = [ex for ex, _ in load_examples(str(bom), "jsonl", **SPEC)]
    assert got == [ex for ex, _ in load_examples(str(plain), "jsonl", **SPEC)]
    assert [(e.prompt_id, e.prompt, e.answer) for e in got] == [("a", "1+1=", "2"),
                                                                 ("b", "2+2=", "4")]


def test_a_data_path_that_is_a_directory_says_so(tmp_path):
    # before: "data file not found", of a path that exists
    with pytest.raises(TaskError, match=rf"data file {tmp_path} is a directory; name the file"):
        load_examples(str(tmp_path), "jsonl", **SPEC)


def test_a_config_path_that_is_a_directory_says_so(tmp_path):
    with pytest.raises(ConfigError, match=r"is a directory, not a TOML file"):  # "does not exist"
        load_config(tmp_path)


def test_a_section_overridden_by_a_value_names_the_override_that_did_it():
    # before: rollout=3 was taken, and the error named the *next* override
    with pytest.raises(ConfigError, match=r"override 'rollout=3': 'rollout' is a section of the "
                                          r"config, not a value; set its keys"):
        load_config("-", ["rollout.group_size=2", "rollout=3"])
    with pytest.raises(ConfigError, match=r"override 'rollout.group_size=2': 'rollout' holds 3 "
                                          r"\(set by the config file or an earlier override\)"):
        load_config("-", ["rollout=3", "rollout.group_size=2"])
    cfg = load_config("-", ["rollout={group_size = 3}"])  # a whole table is still a table
    assert cfg.rollout.group_size == 3


REWARDS = '''
import numpy as np

def array(prompts, completions, **kw):
    return np.array([0.25 * len(c) for c in completions])

def matrix(prompts, completions, **kw):
    return np.ones((len(completions), 1))

def np_scalars(prompts, completions, **kw):
    return [np.float32(0.5) for c in completions]

def bools(prompts, completions, answer, **kw):
    return [c == a for c, a in zip(completions, answer)]
'''


def test_a_reward_may_return_a_numpy_array_scalars_or_bools(tmp_path, monkeypatch):
    (tmp_path / "reroll_np_rewards.py").write_text(REWARDS)
    monkeypatch.syspath_prepend(str(tmp_path))
    r, ex = Rollout("p", "g", [0], 0, completion="12"), Example("p", "q", "12")

    def score(fn):
        return PythonVerifier(fn=f"reroll_np_rewards:{fn}")(r, ex)

    # before: a 1-D array failed every score ("must return a list"), and stopped the run
    assert score("array").value == 0.5 and isinstance(score("array").value, float)
    assert score("np_scalars").value == 0.5
    assert score("bools").value == 1.0
    bad = score("matrix")  # one list per completion, not one value: still an error
    assert not bad.ok and "one value per completion" in bad.error

"""Every train and test prompt is measured against the model's context when the run starts:
one that does not fit is refused (exit 2, prompt id, length and context named, before any
training); those that fit but leave fewer than `rollout.max_new_tokens` positions give one
warning with their count and the first of them."""

import json
import warnings

import pytest

from reroll.cli import main
from reroll.rollout import Example
from reroll.tasks.base import Task, TaskError, check_prompt_lengths


def _task(train: list[str], test: list[str]) -> Task:
    ex = [Example(f"{split}{i}", p, "x") for split, ps in (("a", train), ("b", test))
          for i, p in enumerate(ps)]
    return Task("t", ex[:len(train)], ex[len(train):], {"name": "exact"})


def test_prompts_leaving_too_little_room_are_counted_with_the_first_named():
    # encode = one token per character; a 10-token context and room for 4 new tokens:
    # lengths 5 and 6 leave 5 and 4 positions (fine), 7 and 9 leave 3 and 1 (cut)
    task = _task(["aaaaa", "aaaaaaa", "aaaaaa"], ["aaaaaaaaa"])
    fit = check_prompt_lengths(task, list, 10, where="w", room=4)
    assert (fit.dropped, fit.cut, fit.first_cut) == (0, 2, ("a1", "train", 7))
    assert [e.prompt_id for e in task.train + task.test] == ["a0", "a1", "a2", "b0"]  # kept


def test_a_prompt_that_does_not_fit_is_refused_by_id_length_and_context():
    task = _task(["aaa"], ["aaaaaaaaaa"])  # 10 tokens in a 10-token context: no room at all
    with pytest.raises(TaskError, match=r"w: prompt 'b0' \(test example 0\) has 10 tokens, but "
                                        r"the model holds 10"):
        check_prompt_lengths(task, list, 10, where="w", room=4)
    fit = check_prompt_lengths(_task(["aaa"], ["aaaaaaaaaa"]), list, 10, where="w", skip=True,
                               room=4)
    assert (fit.dropped, fit.cut) == (1, 0)


def test_a_run_warns_once_about_prompts_whose_answers_will_be_cut(tmp_path):
    data = tmp_path / "d.jsonl"
    # the test tokenizer: one token per character plus BOS; a 32-token context and
    # max_new_tokens 4: "9"*26 + "=" is 28 tokens (4 left, fine), "9"*27 + "=" and
    # "9"*28 + "=" are 29 and 30 (3 and 2 left: cut)
    rows = [{"id": "s1", "prompt": "1+1=", "answer": "2"},
            {"id": "s2", "prompt": "2+1=", "answer": "3"},
        {"id": "edge", "prompt": "9" * 26 + "=", "answer": "9"},
        {"id": "cut1", "prompt": "9" * 27 + "=", "answer": "9"},
        {"id": "cut2", "prompt": "9" * 28 + "=", "answer": "9"}]
    data.write_text("".join(json.dumps(r) + "\n" for r in rows))
    args = ["train", "-", "task.name=jsonl", f'task.args={{path="{data}", id_field="id", '
            f'test_fraction=0.2}}', "model.max_position=32", "rollout.max_new_tokens=4",
            "train.steps=1", "reward.workers=0", "rollout.group_size=2",
            "rollout.batch_groups=1", "runtime.threads=1", "--no-progress",
            f"out_dir={tmp_path / 'run'}"]
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        assert main(args) == 0
    cut = [str(w.message) for w in caught if "will be cut" in str(w.message)]
    assert len(cut) == 1, cut
    assert "2 prompt(s) leave fewer than rollout.max_new_tokens = 4" in cut[0]
    assert "32-token context" in cut[0] and str(data) in cut[0]
    # the jsonl task's seeded split puts both in train; train is measured first
    assert "(the first: 'cut1', train, 29 tokens)" in cut[0]
    assert "raise the context (model.max_position)" in cut[0]  # a model built from [model]


def test_the_context_is_the_loaded_models_own_when_it_is_not_built_from_model(tmp_path):
    # model.* builds only a fresh run's tiny model: a run from a checkpoint (init or
    # model.path) and an evaluated checkpoint take the context from that model's config.json
    from types import SimpleNamespace

    from reroll.build import context_of

    ckpt = tmp_path / "sft" / "model"
    ckpt.mkdir(parents=True)
    (ckpt / "config.json").write_text(json.dumps({"max_position_embeddings": 1040}))
    key = f"max_position_embeddings in {ckpt / 'config.json'}"

    def cfg(init="", path=""):
        return SimpleNamespace(init=init, model=SimpleNamespace(path=path, max_position=64))

    assert context_of(cfg()) == (64, "model.max_position")
    assert context_of(cfg(init=str(tmp_path / "sft"))) == (1040, key)  # its model/ inside
    assert context_of(cfg(path=str(ckpt))) == (1040, key)
    assert context_of(cfg(), ckpt) == (1040, key)  # `reroll eval --checkpoint` of a tiny config
    assert context_of(cfg(init=str(tmp_path / "none"))) is None  # refused elsewhere, by name

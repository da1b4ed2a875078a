"""Drafters (reroll.replay.drafts, reroll.methods.specrl, reroll.methods.das): the store of earlier responses, the majority path of
das, spec_rl's per-sample drafts, config validation, and speculative rollouts through the
real pipeline on a tiny model (later epochs start from the recorded responses)."""

import pytest

from reroll.config_checks import load_checked
from reroll.engine.suffix import majority_path
from reroll.errors import ConfigError
from reroll.methods.das import SuffixDrafter
from reroll.methods.specrl import SpecRL
from reroll.replay.drafts import DraftPlanner, DraftStore
from reroll.rollout import Example, Group, Rollout, Span, SuffixSource
from reroll.runlog import read_metrics, read_rollouts
from reroll.runtime import train


def _group(prompt: str, responses: list[list[int]], finish: str = "stop") -> Group:
    g = Group(group_id="g" + prompt, example=Example(prompt, prompt, "0"), target_size=0)
    for i, resp in enumerate(responses):
        r = Rollout(prompt_id=prompt, group_id=g.group_id, tokens=[1, 2], prompt_len=2,
                    index_in_group=i, sample_id=f"{prompt}-{i}")
        for t in resp:
            r.append(t, -0.5, 3)
        r.finish = finish
        g.rollouts.append(r)
    g.target_size = len(responses)
    return g


def test_majority_path_follows_the_most_shared_prefix_while_enough_agree():
    rs = [[5, 6, 7], [5, 6, 8], [5, 6, 8, 9], [4]]
    # depth 0: 5 x3, 4 x1 -> 5; depth 1: 6 x3; depth 2: 8 x2, 7 x1 -> 8; depth 3: 9 x1 < 2
    assert majority_path(rs, 2) == [5, 6, 8]
    assert majority_path(rs, 1) == [5, 6, 8, 9]
    assert majority_path(rs, 4) == []  # never 4 agree at depth 0
    assert majority_path([[3], [2]], 1) == [2]  # a tie goes to the smaller id


def test_the_store_keeps_the_last_groups_of_each_prompt_and_only_fresh_finished_samples():
    s = DraftStore(history=2, max_prompts=2)
    s.add([_group("a", [[1], [2]]), _group("b", [[3]])])
    s.add([_group("a", [[4]]), _group("a", [[5]])])  # a: [[4]], [[5]] (the oldest goes)
    assert [t for t, _, _ in s.recent("a")] == [[4], [5]]
    assert s.latest("a")[0][0] == [5]
    s.add([_group("c", [[6]])])  # b was updated least recently: dropped beyond 2 prompts
    assert list(s.groups) == ["a", "c"]
    s.add([_group("d", [[7]], finish="pruned")])  # nothing kept from a pruned sample
    assert "d" not in s.groups
    back = DraftStore(history=2, max_prompts=2)
    back.load_state(s.state())
    assert back.groups == s.groups


def test_spec_rl_gives_sample_i_response_i_of_the_last_group_with_its_logprobs():
    d = SpecRL(lenience=1.5)
    d.store.add([_group("a", [[7, 8], [9]])])
    r2 = Rollout(prompt_id="a", group_id="x", tokens=[1, 2], prompt_len=2, index_in_group=2)
    draft = d.draft(r2)  # index 2 of 2 responses: response 0 again
    assert (draft.tokens, draft.logprobs, draft.lenience, draft.source) == (
        (7, 8), (-0.5, -0.5), 1.5, "a-0")
    assert d.draft(Rollout(prompt_id="new", group_id="y", tokens=[1], prompt_len=1)) is None


def test_the_draft_planner_counts_accepted_and_sampled_tokens_and_round_trips_its_state():
    dr = DraftPlanner(SuffixDrafter(history=1, min_count=1))
    g = _group("a", [[5, 6]])
    r = g.rollouts[0]
    r.spans = [Span(0, 2, "prompt"), Span(2, 3, "draft", 3), Span(3, 4, "sampled", 3)]
    dr.add([g])
    fresh = Rollout(prompt_id="a", group_id="z", tokens=[1, 2], prompt_len=2)
    dr.prepare([fresh])
    assert fresh.sampling.draft.tokens == (5, 6) and fresh.sampling.draft.logprobs == ()
    m = dr.metrics()
    assert (m["draft/tokens_accepted"], m["draft/tokens_sampled"],
            m["draft/samples_drafted"], m["draft/tokens_proposed"]) == (1, 1, 1, 2)
    back = DraftPlanner(SuffixDrafter(history=1, min_count=1))
    back.load_state(dr.state())
    assert back.metrics() == m and back.drafter.store.groups == dr.drafter.store.groups


@pytest.mark.parametrize("extra, match", [
    (["replay.draft=spec_rlx"], "spec_rl"),
    (["replay.draft=spec_rl", "replay.draft_args={lenience=0.5}"], "lenience"),
    (["replay.draft=das", "replay.draft_args={lenience=2.0}"], "lenience"),
    (["replay.draft_args={lenience=2.0}"], "takes no draft_args"),
    (["replay.draft=das", "rollout.workflow=multi_turn", "rollout.env=guess"],
     "single_turn"),
])
def test_bad_draft_settings_fail_when_the_config_loads(extra, match):
    with pytest.raises(ConfigError, match=match):
        load_checked(None, extra)


def test_later_epochs_start_from_the_recorded_responses_of_the_same_prompt(tmp_path,
                                                                           small_run):
    # 8 prompts, 4 groups a step: every prompt comes back every second step
    train(small_run(tmp_path, "train.steps=4", "task.args.n_train=8", "replay.draft=spec_rl",
                    "record_every=1"), progress=False)
    by_id = {r["sample_id"]: (step, g["example"]["prompt_id"], r)
             for step, g in read_rollouts(tmp_path) for r in g["rollouts"]}
    drafted = 0
    for step, prompt, r in by_id.values():
        d = r["sampling"]["draft"]
        if d is None:
            continue
        drafted += 1
        src_step, src_prompt, src = by_id[d["source"]]
        assert src_step < step and src_prompt == prompt
        assert list(d["tokens"]) == src["tokens"][src["prompt_len"]:]
        n = sum(s["end"] - s["start"] for s in r["spans"] if s["source"] == "draft")
        resp = r["tokens"][r["prompt_len"]:]
        assert resp[:n] == list(d["tokens"])[:n]  # the accepted prefix is the draft's
        assert all(r["loss_mask"][r["prompt_len"]:])
    assert drafted >= 16  # steps 3 and 4 draft every sample (4 groups x 4)
    last = read_metrics(tmp_path)[-1]
    assert last["draft/tokens_accepted"] > 0
    total = sum(len(r["tokens"]) - r["prompt_len"] for _, _, r in by_id.values())
    assert last["draft/tokens_accepted"] + last["draft/tokens_sampled"] == total


def test_das_hands_fresh_samples_the_prompts_recent_responses_to_redraft_from():
    dr = DraftPlanner(SuffixDrafter(history=2, min_count=1, draft_len=3, max_draft=6))
    dr.add([_group("a", [[5, 6], [7]])])
    dr.add([_group("a", [[8, 9, 4]])])
    fresh = Rollout(prompt_id="a", group_id="z", tokens=[1, 2], prompt_len=2)
    other = Rollout(prompt_id="b", group_id="y", tokens=[1, 2], prompt_len=2)
    dr.prepare([fresh, other])
    assert fresh.sampling.redraft == SuffixSource(((5, 6), (7,), (8, 9, 4)), min_count=1,
                                                  draft_len=3, max_draft=6)
    assert other.sampling.redraft is None and other.sampling.draft is None  # nothing stored
    off = DraftPlanner(SuffixDrafter(history=2, min_count=1, redraft=False))
    off.add([_group("a", [[5, 6]])])
    fresh2 = Rollout(prompt_id="a", group_id="w", tokens=[1, 2], prompt_len=2)
    off.prepare([fresh2])
    assert fresh2.sampling.redraft is None and fresh2.sampling.draft.tokens == (5, 6)


@pytest.mark.parametrize("args, match", [
    ("{draft_len=0}", "draft_len"),
    ("{draft_len=8, max_draft=4}", "draft_len"),
    ("{redraft=\"yes\"}", "redraft must be true or false"),
])
def test_bad_redraft_settings_fail_when_the_config_loads(args, match):
    with pytest.raises(ConfigError, match=match):
        load_checked(None, ["replay.draft=das", f"replay.draft_args={args}"])


def test_das_samples_redraft_from_the_earlier_responses_of_their_prompt(tmp_path, small_run):
    train(small_run(tmp_path, "train.steps=4", "task.args.n_train=8", "replay.draft=das",
                    "replay.draft_args={min_count=1}", "record_every=1"), progress=False)
    rows = [(step, g["example"]["prompt_id"], r)
            for step, g in read_rollouts(tmp_path) for r in g["rollouts"]]
    earlier: dict[str, set] = {}
    sourced = 0
    for _, prompt, r in sorted(rows, key=lambda x: x[0]):
        src = r["sampling"]["redraft"]
        if src is not None:
            sourced += 1
            assert {tuple(x) for x in src["responses"]} <= earlier.get(prompt, set())
        earlier.setdefault(prompt, set()).add(tuple(r["tokens"][r["prompt_len"]:]))
        assert all(r["loss_mask"][r["prompt_len"]:])
    assert sourced >= 16  # steps 3 and 4: every sample
    last = read_metrics(tmp_path)[-1]
    total = sum(len(r["tokens"]) - r["prompt_len"] for _, _, r in rows)
    assert last["draft/tokens_accepted"] + last["draft/tokens_sampled"] == total
    assert last["engine/redraft_tokens_proposed"] > 0  # the engine re-drafted in decode


def test_a_das_redraft_run_resumes_bitwise_as_the_uninterrupted_run(tmp_path, small_run):
    import torch
    from safetensors.torch import load_file

    extra = ["task.args.n_train=8", "replay.draft=das", "replay.draft_args={min_count=1}",
             "ckpt_every=2"]
    a, b = tmp_path / "a", tmp_path / "b"
    train(small_run(a, "train.steps=4", *extra), progress=False)
    train(small_run(b, "train.steps=2", *extra), progress=False)
    train(small_run(b, "train.steps=4", *extra), resume=True, progress=False)

    def batches(d):
        return [(s, [(r["tokens"], r["sampling"]["redraft"], r["spans"]) for r in g["rollouts"]])
                for s, g in read_rollouts(d)]

    ra, rb = batches(a), batches(b)
    assert ra == rb
    assert any(src is not None for s, rs in ra if s > 2 for _, src, _ in rs)  # sources restored
    assert read_metrics(b)[-1]["engine/redraft_tokens_proposed"] > 0  # the resumed run re-drafted

    def weights(d):
        return load_file(str(d / "checkpoints" / "step_000004" / "model" / "model.safetensors"))

    wa, wb = weights(a), weights(b)
    assert all(torch.equal(wa[k], wb[k]) for k in wa)

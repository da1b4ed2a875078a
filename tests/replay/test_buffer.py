"""The Replay stage's rules on hand-made groups: which groups the buffer keeps and evicts,
what a draw returns, which answers the bank keeps and where one is injected, how a step's
batch is mixed, and that checkpointed state reproduces every later decision."""

import pytest

from reroll.config_checks import load_checked
from reroll.control.controller import Controller
from reroll.replay.bank import ResponseBank
from reroll.replay.buffer import ReplayBuffer, informative, replay_copy, replay_rollout
from reroll.replay.stage import Replay, build_replay, fresh_groups
from reroll.rollout import Example, Group, Rollout, Score


def sample(pid, gid, i, reward, version=0, n=3):
    r = Rollout(prompt_id=pid, group_id=gid, tokens=[1, 2], prompt_len=2, index_in_group=i)
    for t in range(n):
        r.append(10 + t, -0.5 * (t + 1), version)
    r.finish = "stop"
    r.scores = [Score("exact", value=reward)]
    r.reward = reward
    return r


def group(pid, rewards, version=0, gid=None):
    gid = gid or f"{pid}-v{version}"
    g = Group(group_id=gid, example=Example(pid, "q", "a"), target_size=len(rewards),
              start_version=version)
    g.rollouts = [sample(pid, gid, i, x, version) for i, x in enumerate(rewards)]
    return g


def success(r):
    return r.reward >= 1.0


def test_informative_means_rewards_vary():
    assert informative(group("p", [1.0, 0.0]))
    assert not informative(group("p", [1.0, 1.0]))
    g = group("p", [1.0, 0.0])
    g.rollouts[0].reward = None
    assert not informative(g)


def test_a_replayed_copy_keeps_the_record_and_names_its_origin():
    g = group("p", [1.0, 0.0], version=3)
    c = replay_copy(g)
    assert c.group_id != g.group_id and c.prompt_id == "p"
    for old, new in zip(g.rollouts, c.rollouts):
        assert (new.tokens, new.loss_mask, new.logprobs, new.versions, new.reward) == (
            old.tokens, old.loss_mask, old.logprobs, old.versions, old.reward)
        assert new.sample_id != old.sample_id and new.parent_id == old.sample_id
        assert new.group_id == c.group_id and new.prefix_len == 5
        assert [(s.start, s.end, s.source, s.version) for s in new.spans] == [
            (0, 2, "prompt", -1), (2, 5, "replayed", 3)]
        assert new.reused and not old.reused
    r = replay_rollout(g.rollouts[0], group_id="x", index=7)
    assert (r.group_id, r.index_in_group) == ("x", 7)


def test_buffer_keeps_informative_groups_latest_per_prompt_and_evicts_first_in():
    b = ReplayBuffer(2)
    b.add([group("a", [1, 0]), group("b", [1, 1]), group("c", [0, 1])], version=0)
    assert [e["group"].prompt_id for e in b.entries] == ["a", "c"]  # b: all equal
    b.add([group("a", [0, 1], version=1, gid="a-new")], version=1)
    # a's newer group replaces the old one (at the back): c is now the oldest
    assert [e["group"].group_id for e in b.entries] == ["c-v0", "a-new"]
    b.add([group("d", [1, 0], version=2)], version=2)
    assert [e["group"].prompt_id for e in b.entries] == ["a", "d"]  # c evicted (capacity 2)
    assert (b.added, b.evicted) == (4, 2)  # old a replaced, c pushed out


def test_buffer_evicts_groups_older_than_max_age():
    b = ReplayBuffer(10, max_age=2)
    b.add([group("a", [1, 0], version=0), group("b", [1, 0], version=1)], version=1)
    b.add([], version=3)  # a's oldest token is 3 versions old: out; b (2 old) stays
    assert [e["group"].prompt_id for e in b.entries] == ["b"]
    assert b.draw(5, version=4) == []  # b is now 3 old: expired before drawing
    assert b.evicted == 2


def test_draws_are_uniform_without_replacement_seeded_and_skip_excluded_prompts():
    b = ReplayBuffer(10, seed=5)
    b.add([group(p, [1, 0]) for p in "abcde"], version=0)
    first = [g.prompt_id for g in b.draw(3, 1, exclude={"c"})]
    assert len(first) == len(set(first)) == 3 and "c" not in first
    assert first == sorted(first)  # buffer order
    # the same state draws the same groups; the next draw uses the next seed
    again = ReplayBuffer(10, seed=5)
    again.add([group(p, [1, 0]) for p in "abcde"], version=0)
    assert [g.prompt_id for g in again.draw(3, 1, exclude={"c"})] == first
    assert len(b.draw(9, 1)) == 5  # asks for more than there is: all of them
    assert sum(e["times"] for e in b.entries) == 3 + 5
    assert b.replayed == 8


def test_buffer_state_round_trip_reproduces_later_draws():
    b = ReplayBuffer(4, max_age=5, seed=1)
    b.add([group(p, [1, 0]) for p in "abcdef"], version=0)
    b.draw(2, 1)
    c = ReplayBuffer(4, max_age=5, seed=1)
    c.load_state(b.state())
    assert [g.prompt_id for g in c.draw(2, 2)] == [g.prompt_id for g in b.draw(2, 2)]
    assert c.metrics() == b.metrics()


def test_bank_keeps_the_latest_correct_answers_and_injects_into_groups_without_one():
    bank = ResponseBank(per_prompt=2)
    g1 = group("p", [1, 0, 1], version=0)
    g2 = group("p", [0, 1], version=1)
    bank.add([g1, g2], success)
    kept = bank.bank["p"]
    assert [r.sample_id for r in kept] == [g1.rollouts[2].sample_id, g2.rollouts[1].sample_id]
    # a group with no success gets the latest banked answer in place of its last member
    g = group("p", [0, 0, 0], version=2, gid="g")
    g.rollouts[2].group_round = 1
    assert bank.inject(g, success, version=2)
    new = g.rollouts[2]
    assert new.parent_id == g2.rollouts[1].sample_id and new.reused
    assert (new.group_id, new.index_in_group, new.group_round, new.reward) == ("g", 2, 1, 1)
    assert new.versions[2:] == [1, 1, 1] and new.logprobs == g2.rollouts[1].logprobs
    assert bank.injected == 1
    # groups that already have a success, or have a failed score, are left alone
    assert not bank.inject(group("p", [0, 1]), success, 2)
    bad = group("p", [0, 0])
    bad.rollouts[0].scores = [Score("exact", error="boom")]
    assert not bank.inject(bad, success, 2)
    assert not bank.inject(group("q", [0, 0]), success, 2)  # nothing banked for q
    # reused copies are never banked again
    bank2 = ResponseBank()
    bank2.add([g], success)
    assert "p" not in bank2.bank


def test_bank_ignores_answers_older_than_max_age():
    bank = ResponseBank(per_prompt=2, max_age=3)
    bank.add([group("p", [1, 0], version=0), group("p", [1, 0], version=2)], success)
    assert bank.pick("p", 5).versions[-1] == 2  # 3 old: allowed
    assert bank.pick("p", 6) is None  # both more than 3 versions old
    b = ResponseBank(per_prompt=2, max_age=3)
    b.load_state(bank.state())
    assert [r.sample_id for r in b.bank["p"]] == [r.sample_id for r in bank.bank["p"]]


def test_a_step_is_its_fresh_groups_then_replayed_ones_never_its_own():
    stage = Replay(buffer=ReplayBuffer(8), bank=ResponseBank(), replay_groups=2,
                   is_success=success)
    step0 = stage.mix([group("a", [1, 0]), group("b", [0, 1])], version=0)
    assert [g.prompt_id for g in step0] == ["a", "b"]  # the buffer was empty
    step1 = stage.mix([group("a", [1, 0], 1), group("c", [0, 0], 1)], version=1)
    # a is fresh in this batch, so only b can be replayed; c (all wrong) is not stored
    assert [(g.prompt_id, g.rollouts[0].reused) for g in step1] == [
        ("a", False), ("c", False), ("b", True)]
    assert [e["group"].prompt_id for e in stage.buffer.entries] == ["b", "a"]
    assert set(stage.bank.bank) == {"a", "b"}


def test_controller_statistics_learn_only_from_fresh_samples():
    c = Controller(value_of=lambda r: r.reward)
    g = group("p", [0, 0, 0])
    bank = ResponseBank()
    bank.add([group("p", [1, 0])], success)
    assert bank.inject(g, c.success, 1)
    displaced = g.rollouts[2].control["reuse"]["replaced"]
    c.end_step([g])
    rec = c.stats.get("p")
    # the reused answer is not evidence; the wrong sample it displaced still is
    assert (rec.successes, rec.trials) == (0, 3)
    assert [r.sample_id for r in g.generated()][2] == displaced["sample_id"]


def test_reused_answers_shed_what_belonged_to_their_own_group():
    from reroll.trainer.metrics import accuracy

    bank = ResponseBank()
    src = group("p", [1, 0], version=0)
    win = src.rollouts[0]
    win.shaping.update({"dot": -1.0, "dot_threshold": 2.5})  # DOT in its all-correct group
    win.reward = 0.0
    win.sample_weight = 4.0  # DUET: kept past the horizon with q = 0.25
    bank.add([src], lambda r: r.scores[0].value >= 1.0)
    pruned = group("q", [1, 0])
    pruned.rollouts[0].loss_exclusion = "duet_abort"
    bank.add([pruned], lambda r: r.scores[0].value >= 1.0)
    assert "q" not in bank.bank  # a pruned success is never banked
    g = group("p", [0, 0, 0], version=1, gid="g")
    assert bank.inject(g, lambda r: r.scores[0].value >= 1.0, 1)
    new = g.rollouts[2]
    assert (new.reward, new.shaping, new.sample_weight, new.loss_exclusion) == (1.0, {}, 1.0,
                                                                                 None)
    assert new.control["reuse"]["source_weight"] == 4.0
    # metrics see what the policy generated: 0 of 3 here, not the reused 1
    assert accuracy([g]) == 0.0
    a = group("a", [1, 1, 0, 0])
    assert accuracy([a, g]) == 2 / 7


@pytest.mark.parametrize("buffer_size,fraction,batch,expect", [
    (0, 0.5, 4, 4), (8, 0.5, 4, 2), (8, 0.1, 4, 1), (8, 1.0, 4, 4), (8, 0.6, 5, 3)])
def test_fresh_share_of_a_step(buffer_size, fraction, batch, expect):
    cfg = load_checked(None, [f"replay.buffer_size={buffer_size}",
                              f"replay.fresh_fraction={fraction}",
                              f"rollout.batch_groups={batch}"])
    assert fresh_groups(cfg.rollout, cfg.replay) == expect  # round(fraction x batch), at least 1
    stage = build_replay(cfg.replay, cfg.rollout, success, None, seed=cfg.train.seed)
    if buffer_size:
        assert stage.replay_groups == batch - expect
    else:
        assert stage is None


def test_replay_with_no_off_policy_correction_is_refused():
    from reroll.errors import ConfigError

    with pytest.raises(ConfigError, match="algo.correction"):
        load_checked(None, ["replay.reuse=true", "algo.correction=none"])

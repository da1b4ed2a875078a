"""Allocators and the controller against decisions computed by hand:
AR3PO stages, DARS round-2 sizes, XRPO's confidence-interval gain against the shadow price,
Rollout-GDRO's std-proportional sizes, the dual update of the price; the controller folds
outcomes in at step boundaries in a fixed order and its state round-trips."""

import math

import pytest

from reroll.control.allocators import ALLOCATORS
from reroll.control.controller import Controller
from reroll.control.stats import PromptStats
from reroll.rollout import Example, SamplingParams, Score, new_group


def alloc(name, n=8, **kw):
    return ALLOCATORS.get(name)(n, **kw)


def stats_with(**rates):
    """PromptStats where prompt ``pid`` has one observation of s successes in t trials."""
    s = PromptStats()
    for pid, (succ, t) in rates.items():
        s.observe(pid, succ, t, step=0)
    return s


def test_fixed_gives_group_size_once():
    a = alloc("fixed", 8)
    assert (a.initial(None), a.max_size(), a.more(None, [0.0] * 8, 0, 1)) == (8, 8, 0)


def test_ar3po_samples_another_stage_only_while_no_sample_is_correct():
    a = alloc("ar3po_stages", k=2, max_stages=3)
    assert a.initial(None) == 2 and a.max_size() == 6
    assert a.more(None, [0.0, 0.0], 0, rounds=1) == 2  # nothing correct after stage 0
    assert a.more(None, [1.0, 0.0], 1, rounds=1) == 0  # a correct one: done
    assert a.more(None, [0.0] * 4, 0, rounds=2) == 2
    assert a.more(None, [0.0] * 6, 0, rounds=3) == 0  # third stage was the last


def test_dars_round_two_sizes_match_the_schedules():
    et = alloc("dars", 8, n_max=32, schedule="et", std_norm=True)
    # acc 0.25: S = 2 sqrt(0.25 * 0.75) = 0.8660, A_peak = 8: ceil((8 - 6.928) / 0.866) = 2
    assert et.more(None, [1.0, 1.0] + [0.0] * 6, 2, rounds=1) == 2
    # acc 0 -> a = 0.5 / 8 = 0.0625: S = 2 sqrt(0.0625 * 0.9375) = 0.48412;
    # ceil((8 - 3.8730) / 0.48412) = ceil(8.525) = 9
    assert et.more(None, [0.0] * 8, 0, rounds=1) == 9
    assert et.more(None, [1.0] * 4 + [0.0] * 4, 4, rounds=1) == 0  # acc 0.5: no more
    assert et.more(None, [0.0] * 17, 0, rounds=2) == 0  # one extra round only
    no_std = alloc("dars", 8, n_max=10, schedule="et", std_norm=False)
    # S = 2 * 0.25 * 0.75 = 0.375, A_peak = 4: ceil((4 - 3) / 0.375) = 3
    assert no_std.more(None, [1.0, 1.0] + [0.0] * 6, 2, rounds=1) == 2  # capped at 10 - 8
    hw = alloc("dars", 8, n_max=64, schedule="hw", std_norm=False)
    # HW: ceil((2 * 0.75 * 4 - 3) / 0.375) = ceil(8.0) = 8
    assert hw.more(None, [1.0, 1.0] + [0.0] * 6, 2, rounds=1) == 8
    with pytest.raises(ValueError, match="n_max"):
        alloc("dars", 8, n_max=4)


def test_xrpo_samples_more_while_the_interval_shrinks_more_than_the_price():
    a = alloc("xrpo", 8, n0=4, n_max=8, chunk=2, mu=0.05)
    assert a.initial(None) == 4 and a.max_size() == 8
    # values 1,0,1,0: sample std sqrt(1/3) = 0.57735; h(4) = 3.18245 * 0.57735 / 2 = 0.91868,
    # h(5) = 2.77645 * 0.57735 / sqrt(5) = 0.71688; gain 0.2018 > 0.05
    assert a.more(None, [1.0, 0.0, 1.0, 0.0], 2, rounds=1) == 2
    a.mu = 0.21
    assert a.more(None, [1.0, 0.0, 1.0, 0.0], 2, rounds=1) == 0
    a.mu = 0.0
    assert a.more(None, [1.0, 0.0] * 3 + [1.0], 4, rounds=2) == 1  # only 1 left to n_max 8
    assert a.more(None, [1.0, 0.0] * 4, 4, rounds=3) == 0
    # the price follows the budget: mean size (4 + 8) / 2 = 6 < 8, so mu falls by 0.01 * 2
    b = alloc("xrpo", 8, mu=0.05, lr=0.01)
    b.end_step([("a", 4, 1), ("b", 8, 3)], PromptStats())
    assert b.mu == pytest.approx(0.03) and b.total == 12
    c = alloc("xrpo", 8)
    c.load_state(b.state())
    assert (c.mu, c.total) == (b.mu, b.total)


def test_gdro_sizes_follow_the_bernoulli_std_over_the_price():
    a = alloc("gdro", 8, n_min=2, n_max=16, mu=0.05, bin_by="mean_rate")
    assert a.initial(None) == 10  # unseen: p = 0.5, sqrt(0.25) / 0.05 = 10
    s = stats_with(easy=(8, 8), hard=(0, 8), tenth=(1, 10))
    assert a.initial(s.get("easy")) == 2  # p = 1: std 0, clipped up to n_min
    assert a.initial(s.get("tenth")) == 6  # sqrt(0.1 * 0.9) / 0.05 = 6
    a.mu = 0.02
    assert a.initial(None) == 16  # 25, clipped to n_max
    # at a boundary prompts pool by bin (4 bins of their own rate): "tenth" (0.1) and "hard"
    # (0) share bin 0, pooled 1 / 18; "easy" is alone in bin 3; the prior is 9 / 26
    a.mu = 0.05
    a.end_step([("easy", 8, 8), ("hard", 8, 0), ("tenth", 10, 1)], s)
    assert a.bin_rate == [pytest.approx(1 / 18), None, None, 1.0]
    assert a.prior == pytest.approx(9 / 26)
    # mean size 26 / 3 = 8.667 > 8: mu rises by 0.002 * 0.667
    assert a.mu == pytest.approx(0.05 + 0.002 * (26 / 3 - 8))
    p = 1 / 18
    assert a.initial(s.get("hard")) == round(math.sqrt(p * (1 - p)) / a.mu)  # 0.229/0.0513 = 4


def group(pid, rewards, rounds=None):
    g = new_group(Example(pid, "", ""), len(rewards), [1, 2], SamplingParams(), 0, max_size=8)
    for r, v, k in zip(g.rollouts, rewards, rounds or [0] * len(rewards)):
        r.finish, r.group_round = "stop", k
        r.scores, r.reward = [Score("exact", value=v)], v
    return g


def test_controller_caps_growth_at_the_reservation_and_never_decides_on_errors():
    c = Controller(alloc("ar3po_stages", k=2, max_stages=8), value_of=lambda r: r.reward)
    g = group("p", [0.0, 0.0])
    g.max_size = 3
    assert c.more(g) == 1  # ar3po asks 2, the group reserved 3
    g.rollouts[1].scores = [Score("exact", error="boom")]
    g.rollouts[1].reward = None
    assert c.more(g) == 0
    assert c.plan("p", 0, 8) == {"size": 2, "max_size": 16, "max_new_tokens": None}


def test_controller_folds_drops_by_admission_order_then_consumed_groups_at_the_boundary():
    c = Controller(alloc("fixed", 2), success_at=1.0)
    c.dropped(group("d2", [1.0, 1.0]), seq=7)
    c.dropped(group("d1", [0.0, 0.0]), seq=3)
    assert len(c.stats) == 0  # nothing counts before the boundary
    c.end_step([group("x", [1.0, 0.5]), group("d1", [1.0, 0.0])])
    rec = c.stats.get("d1")
    assert rec.history == [(0, 0, 2), (0, 1, 2)]  # the drop (seq 3) first, then the batch
    assert c.stats.get("x").successes == 1  # 0.5 < success_at
    assert c.stats.get("d2").rate == 1.0 and c.step == 1
    fresh = Controller(alloc("fixed", 2))
    fresh.load_state(c.state())
    assert fresh.state() == c.state()


def test_xrpo_reads_successes_whatever_the_reward_scale():
    a = alloc("xrpo", 8, n0=4, n_max=8, chunk=2, mu=0.05)
    # a weight-2 verifier: values 0/2, one success; the interval is over 1,0,0,0 indicators:
    # std 0.5, h(4) = 3.18245 * 0.5 / 2 = 0.7956, h(5) = 2.77645 * 0.5 / sqrt(5) = 0.6208
    assert a.more(None, [0.0, 0.0, 2.0, 0.0], 1, rounds=1) == 2
    a.mu = 0.18  # gain 0.1748
    assert a.more(None, [0.0, 0.0, 2.0, 0.0], 1, rounds=1) == 0


def test_a_group_larger_than_a_version_may_start_is_refused_at_load():
    from reroll.config import ConfigError
    from reroll.config_checks import load_checked

    with pytest.raises(ConfigError, match="may grow a group to 32 samples, more than the 8"):
        load_checked(None, ["control.allocator=dars", "rollout.batch_groups=2",
                            "rollout.group_size=4"])
    load_checked(None, ["control.allocator=dars", "rollout.batch_groups=2",
                        "rollout.group_size=4", "runtime.max_staleness=3"])  # 32 fits

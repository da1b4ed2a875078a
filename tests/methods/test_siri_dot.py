"""SIRI's length schedule and DOT's group shaper as the stages use them (reroll.methods.siri,
reroll.methods.dot): the schedule's limits by version, and the controller applying DOT
through the SHAPERS registry to all-correct groups only; the rules' values by hand (their
argument checks are in test_rules)."""

import math

import pytest

from reroll.control.allocators import ALLOCATORS
from reroll.control.controller import Controller
from reroll.control.lengths import LENGTHS
from reroll.control.shapers import SHAPERS
from reroll.methods.dot import dot_threshold
from reroll.methods.siri import siri_max_len
from reroll.rollout import Example, SamplingParams, Score, new_group


def alloc(name, n=8, **kw):
    return ALLOCATORS.get(name)(n, **kw)


def group(pid, rewards):
    g = new_group(Example(pid, "", ""), len(rewards), [1, 2], SamplingParams(), 0, max_size=len(rewards))
    for r, v in zip(g.rollouts, rewards):
        r.finish, r.group_round = "stop", 0
        r.scores, r.reward = [Score("exact", value=v)], v
    return g


# --- the rules ---------------------------------------------------------------------------

def test_siri_max_len_cosine_cycle():
    kw = dict(low=4096, high=8192, period=100)
    # step 25: cos(pi/2) = 0 -> 4096 + 4096/2 = 6144 ; step 50: cos(pi) = -1 -> 8192
    # step 1: (1 - cos(0.0628319))/2 = (1 - 0.9980267)/2 = 0.00098664 -> 4096 + 4.04 -> 4100
    assert [siri_max_len(s, **kw) for s in (0, 1, 25, 50, 75, 100, 150)] == [
        4096, 4100, 6144, 8192, 6144, 4096, 8192]
    # expand starts high: step 0 -> 8192, step 50 -> 4096
    assert siri_max_len(0, start="expand", **kw) == 8192
    assert siri_max_len(50, start="expand", **kw) == 4096
    # odd period 3, low 1, high 4: step 1 cos(2pi/3) = -0.5 -> compress 1 + 3*0.75 = 3.25 -> 3,
    # expand 1 + 3*0.25 = 1.75 -> 2
    assert siri_max_len(1, low=1, high=4, period=3) == 3
    assert siri_max_len(1, low=1, high=4, period=3, start="expand") == 2
    # low == high: constant
    assert siri_max_len(7, low=512, high=512, period=10) == 512


def test_siri_max_len_rounds_half_up():
    # period 4, step 1: cos(pi/2) ~ 6e-17 -> 2 + 1*0.5 = 2.5 -> 3 (Python's round would give 2)
    assert siri_max_len(1, low=2, high=3, period=4) == 3


def test_dot_threshold_mean_plus_k_std_and_quantile():
    # [100, 200, 300, 400]: mean 250, population var (150^2*2 + 50^2*2)/4 = 12500, std 111.8034
    # the default k is 3 (DOT's 3 sigma): 250 + 3 * 111.803399
    assert dot_threshold([100, 200, 300, 400]) == pytest.approx(250 + 3 * 111.803399)
    assert dot_threshold([100, 200, 300, 400], k=2.0) == pytest.approx(250 + 2 * 111.803399)
    assert dot_threshold([100, 200, 300, 400], k=1.0) == pytest.approx(361.803399)
    assert dot_threshold([100, 200, 300, 400], k=0.0) == 250.0
    # linear quantile 0.75: position 0.75*3 = 2.25 -> 300 + 0.25*100 = 325 ; 0.5 -> 250
    assert dot_threshold([400, 100, 300, 200], quantile=0.75) == 325.0
    assert dot_threshold([100, 200, 300, 400], quantile=0.5) == 250.0
    assert dot_threshold([100, 200, 300, 400], quantile=1.0) == 400.0
    # one response or equal lengths: the threshold is the length itself (nothing above it)
    assert dot_threshold([500]) == 500.0
    assert dot_threshold([300, 300, 300], k=3.0) == 300.0


# --- as the stages use them ------------------------------------------------------------

def test_siri_schedule_values():
    siri = LENGTHS.get("siri")(8, low=4, period=4)
    # L = 4 + 4 (1 - cos(2 pi v / 4)) / 2
    assert [siri(v) for v in range(5)] == [4, 6, 8, 6, 4]
    expand = LENGTHS.get("siri")(8, low=4, period=4, start="expand")
    assert [expand(v) for v in range(3)] == [8, 6, 4]
    assert LENGTHS.get("siri")(8).low == 4  # low = 0: half the limit
    with pytest.raises(ValueError, match="low"):
        LENGTHS.get("siri")(8, low=9)


def test_dot_penalty_variant_penalises_only_length_outliers_of_all_correct_groups():
    def grp(rewards, lengths):
        g = group("p", rewards)
        for r, n in zip(g.rollouts, lengths):
            for _ in range(n):
                r.append(5, -0.1, 0)
        return g

    c = Controller(alloc("fixed", 4), shapers=[SHAPERS.get("dot")(k=1.0, quantile=0.0, penalty=0.5,
                                                                    rule="penalty")])
    # lengths 2, 2, 2, 10: mean 4, population std sqrt((3 * 4 + 36) / 4) = 3.464;
    # threshold 4 + 3.464 = 7.46: only the 10-token answer is an outlier
    g = grp([1.0] * 4, [2, 2, 2, 10])
    c.finish(g)
    assert [r.reward for r in g.rollouts] == [1.0, 1.0, 1.0, 0.5]
    assert g.rollouts[3].shaping["dot"] == -0.5
    assert g.rollouts[3].shaping["dot_threshold"] == pytest.approx(4 + 12 ** 0.5)
    assert all(len(r.scores) == 1 for r in g.rollouts)  # verifier scores untouched
    c.finish(g)  # finishing twice (a restored group) does not penalise twice
    assert g.rollouts[3].reward == 0.5
    hard = grp([1.0, 1.0, 1.0, 0.0], [2, 2, 2, 10])  # a failure: long reasoning is kept
    c.finish(hard)
    assert [r.reward for r in hard.rollouts] == [1.0, 1.0, 1.0, 0.0]
    wide = Controller(alloc("fixed", 4), shapers=[SHAPERS.get("dot")(k=2.0, quantile=0.0, penalty=0.5,
                                                                   rule="penalty")])
    g2 = grp([1.0] * 4, [2, 2, 2, 10])  # threshold 4 + 6.93 = 10.93: nothing
    wide.finish(g2)
    assert [r.reward for r in g2.rollouts] == [1.0] * 4


def test_dot_keys_build_the_registered_dot_shaper():
    """control.dot_k / dot_quantile / dot_penalty reach the controller as the SHAPERS entry
    "dot" with those hyperparameters, and shape a group as that entry built by hand does."""
    from reroll.config_checks import load_checked
    from reroll.control.wiring import build_control

    def grp():
        g = group("p", [1.0] * 4)
        for r, n in zip(g.rollouts, [2, 2, 2, 10]):
            for _ in range(n):
                r.append(5, -0.1, 0)
        return g

    cfg = load_checked(None, ["control.dot_k=1.0", "control.dot_penalty=0.5",
                              "control.dot_rule=penalty"])
    ctl, _ = build_control(cfg, [Example("p", "1+1=", "2")], lambda r: r.reward)
    assert [type(x) for x in ctl.shapers] == [type(SHAPERS.get("dot")(k=1.0, quantile=0.0,
                                                                       penalty=0.5))]
    assert (ctl.shapers[0].rule, ctl.shapers[0].penalty) == ("penalty", 0.5)
    by_config, by_hand = grp(), grp()
    ctl.finish(by_config)
    Controller(alloc("fixed", 4), shapers=[SHAPERS.get("dot")(
        k=1.0, quantile=0.0, penalty=0.5, rule="penalty")]).finish(by_hand)
    assert [(r.reward, r.shaping) for r in by_config.rollouts] == [
        (r.reward, r.shaping) for r in by_hand.rollouts]
    assert [r.reward for r in by_config.rollouts] == [1.0, 1.0, 1.0, 0.5]
    off, _ = build_control(load_checked(None, []), [Example("p", "1+1=", "2")], lambda r: r.reward)
    assert off.shapers == []
    paper, _ = build_control(load_checked(None, ["control.dot_k=3.0"]),
                             [Example("p", "1+1=", "2")], lambda r: r.reward)
    assert (paper.shapers[0].rule, paper.shapers[0].k) == ("truncate", 3.0)


def test_dot_truncates_the_3_sigma_tail_of_all_correct_groups_by_default():
    """With n - 1 equal lengths and one longer, the longer one lies sqrt(n - 1) population
    stds above the mean, so 3 sigma needs n > 10: with 8 members (2 x 7, 200) nothing is
    cut. With 11 (2 x 10, 20): mean 40 / 11 = 3.636, std 5.175, threshold 19.160: the
    20-token answer is cut after 19 tokens and scores 0 (cut before its answer)."""
    def grp(rewards, lengths):
        g = group("p", rewards)
        for r, n in zip(g.rollouts, lengths):
            for _ in range(n):
                r.append(5, -0.1, 0)
        return g

    dot = SHAPERS.get("dot")()  # the defaults: k = 3, rule "truncate"
    c = Controller(alloc("fixed", 11), shapers=[dot])
    eight = grp([1.0] * 8, [2] * 7 + [200])
    c.finish(eight)
    assert [r.reward for r in eight.rollouts] == [1.0] * 8 and eight.rollouts[7].n_sampled == 200
    g = grp([1.0] * 11, [2] * 10 + [20])
    c.finish(g)
    out = g.rollouts[10]
    thr = 40 / 11 + 3 * math.sqrt((10 * (2 - 40 / 11) ** 2 + (20 - 40 / 11) ** 2) / 11)
    assert thr == pytest.approx(19.1603, abs=1e-4)
    assert [r.reward for r in g.rollouts] == [1.0] * 10 + [0.0]
    assert out.loss_mask[out.prompt_len:] == [True] * 19 + [False]  # cut after 19 tokens
    assert len(out.tokens) == out.prompt_len + 20  # the record keeps every token
    assert out.shaping == {"dot": -1.0, "dot_threshold": pytest.approx(thr), "dot_cut": 19.0}
    assert all(r.n_sampled == 2 for r in g.rollouts[:10])
    c.finish(g)  # a restored group completing again is left as it is
    assert out.reward == 0.0 and out.n_sampled == 19
    hard = grp([0.0] + [1.0] * 10, [2] * 10 + [20])  # a failure: long reasoning is kept
    c.finish(hard)
    assert hard.rollouts[10].reward == 1.0 and hard.rollouts[10].n_sampled == 20

"""Prompt selectors against choices and numbers computed by hand: DOTS takes the prompts
predicted nearest 50% success (unseen ones count as 50%), VADE's decayed Beta posterior,
Prompt-GDRO's multiplicative weights and bins; picks are a function of (seed, draw) and the
statistics, so a restored selector picks what the original would have."""

import math

import pytest

from reroll.control.selectors import SELECTORS
from reroll.control.stats import PromptStats
from reroll.rollout import Example

EXS = [Example(f"p{i}", f"{i}=", str(i)) for i in range(4)]


def stats(**obs):
    s = PromptStats()
    for pid, hist in obs.items():
        for step, succ, n in hist:
            s.observe(pid, succ, n, step)
    return s


def test_dots_picks_the_prompts_predicted_nearest_half():
    st = stats(p0=[(0, 4, 8)], p1=[(0, 8, 8)], p2=[(0, 0, 8)])  # p3 unseen: 0.5
    sel = SELECTORS.get("dots")(EXS, 0, 2, pool=0)
    picked = {sel.pick(0, st).prompt_id, sel.pick(1, st).prompt_id}
    assert picked == {"p0", "p3"}
    # a warmer temperature lets the others in, at rates exp(-0.5 / tau) relative
    warm = SELECTORS.get("dots")(EXS, 0, 4, pool=0, tau=10.0)
    assert {warm.pick(d, st).prompt_id for d in range(4)} == {"p0", "p1", "p2", "p3"}
    # a round is fixed once drawn, and a restored selector continues it
    again = SELECTORS.get("dots")(EXS, 0, 2, pool=0)
    again.load_state(sel.state())
    assert again.pick(1, stats()).prompt_id == sel.pick(1, st).prompt_id


def test_vade_posterior_decays_old_evidence():
    sel = SELECTORS.get("vade")(EXS, 0, 2, decay=0.5, update_decay=1.0)  # one scale
    rec = stats(p0=[(0, 3, 4), (2, 1, 4)]).get("p0")
    # (1,1) + 3/1 -> (4, 2); two steps later: 1 + 0.25 * 3 + 1 = 2.75, 1 + 0.25 * 1 + 3 = 4.25;
    # one more step to step 3: 1 + 0.5 * 1.75 = 1.875, 1 + 0.5 * 3.25 = 2.625
    assert sel.posterior(rec, 3) == pytest.approx((1.875, 2.625))
    assert sel.posterior(None, 3) == (1.0, 1.0)


def test_vade_prefers_prompts_with_variance():
    # p0 and p1 are known to be always solved or never; p2/p3 split evenly
    st = stats(p0=[(0, 40, 40)], p1=[(0, 0, 40)], p2=[(0, 20, 40)], p3=[(0, 20, 40)])
    sel = SELECTORS.get("vade")(EXS, 0, 2, decay=1.0, pool=0)
    for r in range(5):
        assert {sel.pick(2 * r, st).prompt_id, sel.pick(2 * r + 1, st).prompt_id} == {"p2", "p3"}


def test_prompt_gdro_weights_and_bins():
    sel = SELECTORS.get("gdro")(EXS, 0, 2, bins=2, eta=1.0, floor=0.0, rate=1.0,
                                bin_by="mean_rate")
    st = stats(p0=[(0, 1, 4)])
    sel.end_step([("p0", 4, 1)], st)
    # p0 was drawn from the unseen bin (rate 0.5 -> bin 1): failure 0.75; bin 0 scored 0
    e = math.exp(0.75)
    assert sel.weights == pytest.approx([1 / (1 + e), e / (1 + e)])
    assert sel.bin_of == {"p0": 0}  # its own rate 0.25 now puts it in bin 0
    # draws follow the weights: p0 alone in bin 0, the unseen three in bin 1
    draws = [sel.pick(d, st).prompt_id for d in range(2000)]
    share = draws.count("p0") / len(draws)
    assert abs(share - 1 / (1 + e)) < 0.03  # 0.3208
    clone = SELECTORS.get("gdro")(EXS, 0, 2, bins=2, eta=1.0, floor=0.0, rate=1.0,
                                bin_by="mean_rate")
    clone.load_state(sel.state())
    assert [clone.pick(d, st).prompt_id for d in range(50)] == draws[:50]


def test_prompt_gdro_floor_mixes_in_uniform():
    sel = SELECTORS.get("gdro")(EXS, 0, 2, bins=2, eta=1.0, floor=0.5, rate=1.0)
    sel.end_step([("p0", 4, 0)], stats(p0=[(0, 0, 4)]))
    # bin 1 score 1.0: w = (1, e) / (1 + e) mixed half with uniform 1/2
    e = math.e
    assert sel.weights == pytest.approx([0.5 / (1 + e) + 0.25, 0.5 * e / (1 + e) + 0.25])


def test_abandoned_prompts_are_never_picked_again():
    st = stats(p0=[(0, 4, 8)])  # p0 the best DOTS candidate; p1..p3 unseen (0.5) tie it
    for name, kw in [("dots", {"pool": 0}), ("vade", {"pool": 0}), ("gdro", {})]:
        sel = SELECTORS.get(name)(EXS, 0, 2, **kw)
        sel.exclude("p0")
        sel.exclude("p3")
        clone = SELECTORS.get(name)(EXS, 0, 2, **kw)
        clone.load_state(sel.state())
        for s_ in (sel, clone):
            assert {s_.pick(d, st).prompt_id for d in range(40)} <= {"p1", "p2"}

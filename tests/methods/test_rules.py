"""The methods' rollout-control rules (and the shared ones in `reroll.control.rules`)
against values computed by hand (arithmetic in the comments)."""

import math
import random

import pytest

from reroll.control.rules import dual_step
from reroll.methods.ar3po import ar3po_more
from reroll.methods.dars import dars_extra
from reroll.methods.dot import dot_threshold
from reroll.methods.dots import dots_weights
from reroll.methods.duet import duet_allocation, duet_keep
from reroll.methods.gdro import ema, gdro_sizes, mw_update
from reroll.methods.siri import siri_max_len
from reroll.methods.vade import beta_update, info_score
from reroll.methods.xrpo import t_halfwidth, xrpo_gain

# Student-t quantiles from a printed table (two-sided 95%): t_{0.975,3} = 3.182446,
# t_{0.975,4} = 2.776445, t_{0.975,5} = 2.570582; t_{0.95,9} = 1.833113 (two-sided 90%).
T3, T4, T5 = 3.182446, 2.776445, 2.570582


# --- AR3PO --------------------------------------------------------------------------------

def test_ar3po_more_adds_k_while_no_correct_and_stages_remain():
    # max_stages 3 -> stages 0, 1, 2; after stage 0 and 1 a prompt with no correct gets k = 4 more
    assert ar3po_more(0, 4, 0, k=4, max_stages=3) == 4
    assert ar3po_more(0, 8, 1, k=4, max_stages=3) == 4
    # after the last stage (2 + 1 == 3) nothing more, even with no correct response
    assert ar3po_more(0, 12, 2, k=4, max_stages=3) == 0
    # one correct response retires the prompt at any stage
    assert ar3po_more(1, 4, 0, k=4, max_stages=3) == 0
    assert ar3po_more(3, 8, 1, k=4, max_stages=3) == 0
    # a single stage means the initial k samples are all there is
    assert ar3po_more(0, 4, 0, k=4, max_stages=1) == 0


# --- DARS ---------------------------------------------------------------------------------

def test_dars_extra_equal_treatment_and_hardness_weighted_without_std():
    # acc = 0.25, n = 8: S = 2*0.25*0.75 = 0.375, A_peak = 8/2 = 4, n S = 3
    # ET: ceil((4 - 3)/0.375) = ceil(2.667) = 3
    assert dars_extra(0.25, 8, n_max=32) == 3
    # HW: 2(1-a) A_peak = 2*0.75*4 = 6 -> ceil((6 - 3)/0.375) = ceil(8.0) = 8
    assert dars_extra(0.25, 8, n_max=64, schedule="hw") == 8


def test_dars_extra_with_std_norm():
    # acc = 0.25, n = 8: S = 2 sqrt(0.1875) = 0.866025, A_peak = 8, n S = 6.928203
    # ET: (8 - 6.928203)/0.866025 = 1.2376 -> 2
    assert dars_extra(0.25, 8, n_max=32, std_norm=True) == 2
    # HW: 2*0.75*8 = 12 -> (12 - 6.928203)/0.866025 = 5.8564 -> 6
    assert dars_extra(0.25, 8, n_max=64, schedule="hw", std_norm=True) == 6


def test_dars_extra_zero_accuracy_uses_half_over_n_and_caps():
    # acc = 0, n = 8 -> a = 0.5/8 = 0.0625: S = 2*0.0625*0.9375 = 0.1171875, n S = 0.9375
    # ET: (4 - 0.9375)/0.1171875 = 26.13 -> 27, capped at n_max - n = 32 - 8 = 24
    assert dars_extra(0.0, 8, n_max=32) == 24
    assert dars_extra(0.0, 8, n_max=100) == 27
    # HW: 2*0.9375*4 = 7.5 -> (7.5 - 0.9375)/0.1171875 = 6.5625/0.1171875 = 56 exactly = 64 - 8
    assert dars_extra(0.0, 8, n_max=64, schedule="hw") == 56
    assert dars_extra(0.0, 8, n_max=40, schedule="hw") == 32  # cap 40 - 8
    assert dars_extra(0.0, 8, n_max=8) == 0  # n_max == n: no room at all


def test_dars_extra_is_zero_from_half_accuracy_up():
    for acc in (0.5, 0.625, 1.0):
        assert dars_extra(acc, 8, n_max=32) == 0
        assert dars_extra(acc, 8, n_max=64, schedule="hw", std_norm=True) == 0


def test_dars_extra_float_noise_does_not_add_a_sample():
    # acc = 0.4, n = 20, HW: S = 0.48, A_peak = 10, 2*0.6*10 = 12, n S = 9.6,
    # (12 - 9.6)/0.48 = 5 exactly (floats give 5.000000000000001; a bare ceil would say 6)
    assert dars_extra(0.4, 20, n_max=64, schedule="hw") == 5
    # acc = 0, n = 6, HW: a = 1/12, S = 11/72, A_peak = 3, 2(11/12)*3 = 5.5, n S = 11/12,
    # (55/12)*(72/11) = 30 exactly (floats give 30.000000000000007)
    assert dars_extra(0.0, 6, n_max=64, schedule="hw") == 30


# --- XRPO ---------------------------------------------------------------------------------

def test_t_halfwidth_matches_the_table():
    # n = 5, std = 1: t_{0.975,4}/sqrt(5) = 2.776445/2.236068 = 1.241664
    assert t_halfwidth(1.0, 5) == pytest.approx(1.241664, abs=1e-5)
    # n = 4, std = 2: 3.182446*2/2 = 3.182446
    assert t_halfwidth(2.0, 4) == pytest.approx(T3, abs=1e-5)
    # alpha = 0.1, n = 10, std = 3: 1.833113*3/sqrt(10) = 5.499339/3.162278 = 1.739044
    assert t_halfwidth(3.0, 10, alpha=0.1) == pytest.approx(1.739044, abs=1e-5)
    assert t_halfwidth(0.0, 5) == 0.0


def test_t_halfwidth_is_infinite_below_two_samples():
    assert t_halfwidth(1.0, 1) == math.inf
    assert t_halfwidth(0.0, 0) == math.inf


def test_xrpo_gain_is_the_half_width_drop():
    # [0,1,0,1]: mean 0.5, sum sq 4*0.25 = 1, var = 1/3, s = 0.577350
    # h(4) = 3.182446*0.577350/2 = 0.918693 ; h(5) = 2.776445*0.577350/2.236068 = 0.716878
    assert xrpo_gain([0, 1, 0, 1]) == pytest.approx(0.918693 - 0.716878, abs=1e-5)


def test_xrpo_gain_all_wrong_uses_smoothed_pseudo_std():
    # four zeros: s = 0 -> p = (0+1)/(4+2) = 1/6, pseudo-std sqrt(1/6*5/6) = sqrt(5)/6 = 0.372678
    # h(4) = 3.182446*0.372678/2 = 0.593015 ; h(5) = 2.776445*0.372678/2.236068 = 0.462741
    assert xrpo_gain([0, 0, 0, 0]) == pytest.approx(0.130274, abs=1e-5)
    # four ones mirror it: p = 5/6, same pseudo-std
    assert xrpo_gain([1, 1, 1, 1]) == pytest.approx(0.130274, abs=1e-5)
    assert xrpo_gain([0, 0, 0, 0]) > 0


def test_xrpo_gain_exploration_bonus():
    # + 1 * sqrt(ln(100)/4) = sqrt(4.605170/4) = 1.072983
    assert xrpo_gain([0, 0, 0, 0], explore=1.0, total=100) == pytest.approx(
        0.130274 + 1.072983, abs=1e-5)
    # total 0 counts as 2: 0.5 * sqrt(ln 2 / 4) = 0.5 * 0.416277 = 0.208138
    assert xrpo_gain([0, 0, 0, 0], explore=0.5) == pytest.approx(0.130274 + 0.208138, abs=1e-5)


def test_xrpo_gain_must_sample_below_two():
    assert xrpo_gain([]) == math.inf
    assert xrpo_gain([1.0], explore=1.0, total=10) == math.inf


# --- GDRO ---------------------------------------------------------------------------------

def test_gdro_sizes_proportional_to_bernoulli_std():
    # p = [.5, .1, 0, .9] -> s = [.5, .3, 0, .3]; T = 8*4 = 32; the p = 0 prompt stays at n_min 2
    # the others share 30: c = 30/1.1 = 27.27 -> [13.636, 8.182, -, 8.182] (inside [2, 16])
    # floors [13, 8, 2, 8] = 31, one left -> largest fraction .636 (index 0) -> [14, 8, 2, 8]
    assert gdro_sizes([0.5, 0.1, 0.0, 0.9], mean_budget=8, n_min=2, n_max=16) == [14, 8, 2, 8]


def test_gdro_sizes_water_fills_at_the_upper_bound_and_breaks_ties_by_index():
    # s = [.5, .3, .3], T = 12, n_max 5: unclipped 12/1.1*.5 = 5.45 > 5, so index 0 sits at 5
    # and the others share 7: 3.5 each (c = 11.67, 11.67*.5 >= 5 consistent)
    # floors [5, 3, 3] = 11; fractions .5 and .5 tie -> the lower index gets it -> [5, 4, 3]
    assert gdro_sizes([0.5, 0.1, 0.1], mean_budget=4, n_min=1, n_max=5) == [5, 4, 3]


def test_gdro_sizes_water_fills_at_the_lower_bound():
    # s = [.5, .5, .14], T = 9: unclipped .14*9/1.14 = 1.1 < n_min 2, so index 2 sits at 2;
    # the others share 7: 3.5 each -> floors [3, 3, 2] = 8, tie -> index 0 -> [4, 3, 2]
    assert gdro_sizes([0.5, 0.5, 0.02], mean_budget=3, n_min=2, n_max=10) == [4, 3, 2]


def test_gdro_sizes_zero_std_prompts():
    # all p in {0, 1}: spread evenly, T = 4.5*2 = 9 -> 4.5 each -> tie -> [5, 4]
    assert gdro_sizes([0.0, 1.0], mean_budget=4.5, n_min=1, n_max=10) == [5, 4]
    assert gdro_sizes([0.0, 1.0, 0.0], mean_budget=5, n_min=1, n_max=10) == [5, 5, 5]
    # one informative prompt saturates at n_max 6; the zero-std ones absorb the rest of T = 15:
    # 15 - 6 = 9 -> 4.5 each -> [6, 5, 4]
    assert gdro_sizes([0.5, 0.0, 1.0], mean_budget=5, n_min=2, n_max=6) == [6, 5, 4]


def test_gdro_sizes_infeasible_targets_clip_at_the_bounds():
    assert gdro_sizes([0.5, 0.2, 0.9], mean_budget=100, n_min=2, n_max=10) == [10, 10, 10]
    assert gdro_sizes([0.5, 0.2, 0.9], mean_budget=1, n_min=2, n_max=10) == [2, 2, 2]
    assert gdro_sizes([0.5, 0.2], mean_budget=0, n_min=0, n_max=10) == [0, 0]


def test_gdro_sizes_rounds_the_target_half_up():
    # 2.5 * 3 = 7.5 -> 8 (Python's round would give 8 too; 2.5*1 = 2.5 -> 3 where round gives 2)
    assert sum(gdro_sizes([0.5, 0.3, 0.2], mean_budget=2.5, n_min=1, n_max=8)) == 8
    assert gdro_sizes([0.5], mean_budget=2.5, n_min=1, n_max=8) == [3]


def test_gdro_sizes_sums_to_target_within_bounds_on_many_inputs():
    rng = random.Random(0)
    for _ in range(300):
        m = rng.randint(1, 12)
        p = [rng.choice([0.0, 1.0, rng.random()]) for _ in range(m)]
        lo = rng.randint(0, 4)
        hi = max(lo, 1) + rng.randint(0, 12)
        mean = rng.uniform(0, 18)
        sizes = gdro_sizes(p, mean_budget=mean, n_min=lo, n_max=hi)
        target = min(max(math.floor(mean * m + 0.5), lo * m), hi * m)
        assert sum(sizes) == target, (p, mean, lo, hi, sizes)
        assert all(lo <= n <= hi for n in sizes)
        assert sizes == gdro_sizes(p, mean_budget=mean, n_min=lo, n_max=hi)  # deterministic
        # monotone in the std: a more uncertain prompt never gets fewer samples
        s = [q * (1 - q) for q in p]
        for i in range(m):
            for j in range(m):
                if s[i] > s[j] + 1e-12 and s[j] > 0:
                    assert sizes[i] >= sizes[j], (p, sizes)


def test_dual_step_projected_ascent():
    # overspent: 0.5 + 0.1*(9 - 8) = 0.6 ; underspent: 0.5 + 0.1*(2 - 8) = -0.1 -> 0
    assert dual_step(0.5, 9.0, 8.0, lr=0.1) == pytest.approx(0.6)
    assert dual_step(0.5, 2.0, 8.0, lr=0.1) == 0.0
    assert dual_step(0.5, 7.0, 8.0, lr=0.1) == pytest.approx(0.4)  # 0.5 - 0.1


def test_mw_update_multiplies_normalises_and_mixes():
    # eta = ln 3, scores [1, 0]: [0.5*3, 0.5*1] / 2 = [0.75, 0.25]
    assert mw_update([0.5, 0.5], [1.0, 0.0], eta=math.log(3)) == pytest.approx([0.75, 0.25])
    # floor 0.2: 0.8*0.75 + 0.2/2 = 0.7 ; 0.8*0.25 + 0.1 = 0.3
    assert mw_update([0.5, 0.5], [1.0, 0.0], eta=math.log(3), floor=0.2) == pytest.approx(
        [0.7, 0.3])
    # unnormalised input, same answer
    assert mw_update([2, 2], [1.0, 0.0], eta=math.log(3)) == pytest.approx([0.75, 0.25])
    # a zero-weight bin stays at 0 before the mix, and gets floor/B = 0.25 after it
    assert mw_update([1.0, 0.0], [0.0, 5.0], eta=1.0) == [1.0, 0.0]
    assert mw_update([1.0, 0.0], [0.0, 5.0], eta=1.0, floor=0.5) == pytest.approx([0.75, 0.25])


def test_mw_update_is_stable_for_large_exponents():
    # eta*score = 1000 and 2000 would overflow exp; shifted: [e^-1000, 1] -> [0, 1]
    assert mw_update([0.5, 0.5], [1.0, 2.0], eta=1000.0) == pytest.approx([0.0, 1.0])


def test_ema():
    assert ema(None, 3.0, rate=0.1) == 3.0
    assert ema(2.0, 4.0, rate=0.1) == pytest.approx(2.2)  # 0.9*2 + 0.1*4
    assert ema(2.0, 4.0, rate=0.0) == 2.0
    assert ema(2.0, 4.0, rate=1.0) == 4.0


# --- VADE ---------------------------------------------------------------------------------

def test_beta_update_plain_and_decayed():
    assert beta_update(5.0, 3.0, 2, 1) == (7.0, 4.0)  # decay 1: conjugate update
    # decay 0.5 toward (1, 1): 1 + 0.5*(5-1) + 2 = 5 ; 1 + 0.5*(3-1) + 1 = 3
    assert beta_update(5.0, 3.0, 2, 1, decay=0.5) == (5.0, 3.0)
    # prior (2, 2): 2 + 0.5*3 + 2 = 5.5 ; 2 + 0.5*1 + 1 = 3.5
    assert beta_update(5.0, 3.0, 2, 1, decay=0.5, prior=(2.0, 2.0)) == (5.5, 3.5)
    # decay 0 forgets: prior + new counts
    assert beta_update(50.0, 30.0, 2, 1, decay=0.0) == (3.0, 2.0)


def test_info_score_peaks_at_half():
    assert info_score(0.5) == 0.25
    assert info_score(0.2) == pytest.approx(0.16)  # 0.2*0.8
    assert info_score(0.0) == 0.0 and info_score(1.0) == 0.0


# --- DOTS ---------------------------------------------------------------------------------

def test_dots_weights_softmax_of_distance_to_alpha():
    # tau 0.1: exponents [0, -1, -1] -> [1, e^-1, e^-1] / (1 + 2*0.367879) = [.576117, .211942 x2]
    assert dots_weights([0.5, 0.6, 0.4], tau=0.1) == pytest.approx(
        [0.576117, 0.211942, 0.211942], abs=1e-6)
    # default tau 1e-3: |0.501 - 0.5|/1e-3 = 1 -> [1, e^-1]/(1.367879) = [.731059, .268941]
    assert dots_weights([0.5, 0.501]) == pytest.approx([0.731059, 0.268941], abs=1e-6)
    # alpha 0.2: exponents [-3, 0] at tau 0.1 -> [e^-3, 1]/(1.049787) = [.047426, .952574]
    assert dots_weights([0.5, 0.2], alpha=0.2, tau=0.1) == pytest.approx(
        [0.047426, 0.952574], abs=1e-6)


def test_dots_weights_stable_when_every_exponent_underflows():
    # tau 1e-4: both exponents -5000, exp underflows to 0 (0/0 unshifted); shifted: [0.5, 0.5]
    assert dots_weights([0.0, 1.0], tau=1e-4) == [0.5, 0.5]
    w = dots_weights([0.0, 0.9, 1.0], tau=1e-4)
    assert w == pytest.approx([0.0, 1.0, 0.0]) and sum(w) == pytest.approx(1.0)


# --- DUET ---------------------------------------------------------------------------------

def test_duet_keep_gate_and_weight():
    assert duet_keep(0.01, q=0.05) == (True, 20.0)  # 1/0.05
    assert duet_keep(0.0, q=0.05) == (True, 20.0)
    assert duet_keep(0.05, q=0.05) == (False, 0.0)  # boundary u == q aborts
    assert duet_keep(0.5, q=0.05) == (False, 0.0)
    assert duet_keep(0.999, q=1.0) == (True, 1.0)  # q = 1 never aborts


def test_duet_allocation_proportional_under_the_token_budget():
    # 10000 / 500 = 20 samples; the score-0 prompt stays at n_min 2, the rest share 18 by
    # scores [3, 1, 1]: 3*18/5 = 10.8 > 8 -> index 0 at 8, the two score-1 prompts 5 each
    assert duet_allocation([3, 1, 0, 1], token_budget=10000, mean_len=500, n_min=2,
                           n_max=8) == [8, 5, 2, 5]
    # 9999 / 500 = 19.998 -> 19 (never over budget): 9 left for the two -> 4.5 each -> tie -> [5, 4]
    assert duet_allocation([3, 1, 0, 1], token_budget=9999, mean_len=500, n_min=2,
                           n_max=8) == [8, 5, 2, 4]
    # 3 / 0.1 is 29.999999999999996 in floats but 30 exactly -> 10 each
    assert duet_allocation([1, 1, 1], token_budget=3, mean_len=0.1, n_min=0,
                           n_max=20) == [10, 10, 10]


def test_duet_allocation_keeps_n_min_over_budget_and_caps_at_n_max():
    # 1000 / 500 = 2 samples < 4 * n_min 2: everybody still gets 2 (8*500 = 4000 tokens)
    assert duet_allocation([1, 2, 3, 4], token_budget=1000, mean_len=500, n_min=2,
                           n_max=8) == [2, 2, 2, 2]
    assert duet_allocation([1, 2], token_budget=10**6, mean_len=500, n_min=2,
                           n_max=8) == [8, 8]
    # all scores 0: an even spread of the 12 samples
    assert duet_allocation([0, 0, 0], token_budget=6000, mean_len=500, n_min=1,
                           n_max=8) == [4, 4, 4]


# --- invalid arguments ------------------------------------------------------------------

INVALID = [
    (lambda: ar3po_more(2, 1, 0, k=4, max_stages=3), "n_correct"),
    (lambda: ar3po_more(0, 4, 3, k=4, max_stages=3), "stage"),
    (lambda: ar3po_more(0, 4, 0, k=0, max_stages=3), "k"),
    (lambda: ar3po_more(0, 4, 0, k=True, max_stages=3), "k"),
    (lambda: ar3po_more(0, 4, 0, k=4, max_stages=0), "max_stages"),
    (lambda: dars_extra(1.5, 8, n_max=32), "acc"),
    (lambda: dars_extra(float("nan"), 8, n_max=32), "acc"),
    (lambda: dars_extra(0.25, 0, n_max=32), "n"),
    (lambda: dars_extra(0.25, 8, n_max=4), "n_max"),
    (lambda: dars_extra(0.25, 8, n_max=32, schedule="ht"), "schedule"),
    (lambda: t_halfwidth(-1.0, 5), "std"),
    (lambda: t_halfwidth(1.0, -1), "n"),
    (lambda: t_halfwidth(1.0, 5, alpha=0.0), "alpha"),
    (lambda: t_halfwidth(1.0, 5, alpha=1.0), "alpha"),
    (lambda: xrpo_gain([0, 2]), "values"),
    (lambda: xrpo_gain([0, 1], explore=-1.0), "explore"),
    (lambda: xrpo_gain([0, 1], total=-1), "total"),
    (lambda: xrpo_gain([0], alpha=2.0), "alpha"),
    (lambda: gdro_sizes([], mean_budget=4, n_min=1, n_max=8), "p"),
    (lambda: gdro_sizes([1.2], mean_budget=4, n_min=1, n_max=8), "p"),
    (lambda: gdro_sizes([0.5], mean_budget=-1, n_min=1, n_max=8), "mean_budget"),
    (lambda: gdro_sizes([0.5], mean_budget=4, n_min=9, n_max=8), "n_max"),
    (lambda: gdro_sizes([0.5], mean_budget=4, n_min=-1, n_max=8), "n_min"),
    (lambda: dual_step(-0.1, 1.0, 1.0, lr=0.1), "mu"),
    (lambda: dual_step(0.1, 1.0, 1.0, lr=-0.1), "lr"),
    (lambda: dual_step(0.1, float("inf"), 1.0, lr=0.1), "realized_mean"),
    (lambda: beta_update(0.0, 1.0, 1, 1), "alpha"),
    (lambda: beta_update(1.0, -1.0, 1, 1), "beta"),
    (lambda: beta_update(1.0, 1.0, -1, 1), "successes"),
    (lambda: beta_update(1.0, 1.0, 1, -1), "failures"),
    (lambda: beta_update(1.0, 1.0, 1, 1, decay=1.5), "decay"),
    (lambda: beta_update(1.0, 1.0, 1, 1, prior=(0.0, 1.0)), "prior"),
    (lambda: beta_update(1.0, 1.0, 1, 1, prior=(1.0,)), "prior"),
    (lambda: info_score(-0.1), "p"),
    (lambda: dots_weights([], tau=0.1), "p_hat"),
    (lambda: dots_weights([0.5], tau=0.0), "tau"),
    (lambda: dots_weights([0.5], alpha=1.5), "alpha"),
    (lambda: mw_update([0.5, 0.5], [1.0], eta=1.0), "scores"),
    (lambda: mw_update([0.0, 0.0], [1.0, 0.0], eta=1.0), "weights"),
    (lambda: mw_update([-0.5, 1.5], [1.0, 0.0], eta=1.0), "weights"),
    (lambda: mw_update([0.5, 0.5], [1.0, 0.0], eta=-1.0), "eta"),
    (lambda: mw_update([0.5, 0.5], [1.0, 0.0], eta=1.0, floor=1.5), "floor"),
    (lambda: ema(1.0, 2.0, rate=1.5), "rate"),
    (lambda: ema(float("nan"), 2.0, rate=0.5), "prev"),
    (lambda: siri_max_len(-1, low=1, high=2, period=4), "step"),
    (lambda: siri_max_len(0, low=0, high=2, period=4), "low"),
    (lambda: siri_max_len(0, low=3, high=2, period=4), "high"),
    (lambda: siri_max_len(0, low=1, high=2, period=1), "period"),
    (lambda: siri_max_len(0, low=1, high=2, period=4, start="grow"), "start"),
    (lambda: dot_threshold([]), "lengths"),
    (lambda: dot_threshold([-1, 2]), "lengths"),
    (lambda: dot_threshold([1, 2], k=-1.0), "k"),
    (lambda: dot_threshold([1, 2], quantile=1.5), "quantile"),
    (lambda: duet_keep(0.5, q=0.0), "q"),
    (lambda: duet_keep(0.5, q=1.5), "q"),
    (lambda: duet_keep(-0.1, q=0.5), "u"),
    (lambda: duet_allocation([-1.0], token_budget=100, mean_len=10, n_min=1, n_max=4),
     "scores"),
    (lambda: duet_allocation([1.0], token_budget=-1, mean_len=10, n_min=1, n_max=4),
     "token_budget"),
    (lambda: duet_allocation([1.0], token_budget=100, mean_len=0, n_min=1, n_max=4),
     "mean_len"),
    (lambda: duet_allocation([1.0], token_budget=100, mean_len=10, n_min=5, n_max=4),
     "n_max"),
]


@pytest.mark.parametrize("call,name", INVALID, ids=[f"{i}-{n}" for i, (_, n) in
                                                     enumerate(INVALID)])
def test_invalid_arguments_raise_naming_the_argument(call, name):
    with pytest.raises(ValueError, match=rf": {name}(\[\d\])? must be"):
        call()


def test_duet_allocation_never_exceeds_the_budget_beyond_n_min():
    rng = random.Random(1)
    for _ in range(300):
        m = rng.randint(1, 10)
        scores = [rng.choice([0.0, rng.random() * 5]) for _ in range(m)]
        lo = rng.randint(0, 3)
        hi = max(lo, 1) + rng.randint(0, 10)
        budget, mean_len = rng.randint(0, 40000), rng.uniform(50, 2000)
        sizes = duet_allocation(scores, token_budget=budget, mean_len=mean_len, n_min=lo,
                                n_max=hi)
        assert all(lo <= n <= hi for n in sizes)
        most = math.floor(budget / mean_len)  # samples whose tokens fit the budget
        assert sum(sizes) == min(max(most, lo * m), hi * m), (scores, budget, mean_len, sizes)

"""Advantage estimators against values computed by hand."""

import math

import pytest
import torch

from reroll.algo import ADVANTAGES

# Seven samples in three interleaved groups with non-contiguous ids:
#   group 5 = samples 0, 2, 4, 6 with rewards 1, 0, 0, 1
#   group 9 = samples 1, 5       with rewards 2, 0
#   group 2 = sample 3 alone     with reward  3
REWARDS = torch.tensor([1.0, 2.0, 0.0, 3.0, 0.0, 0.0, 1.0])
GROUPS = torch.tensor([5, 9, 5, 2, 5, 9, 5])
COMPS = REWARDS[:, None]


def close(a, b, tol=1e-5):
    assert torch.allclose(a, torch.tensor(b, dtype=a.dtype), atol=tol), (a, b)


def test_grpo_normalises_within_each_group_with_unbiased_std():
    adv, inc = ADVANTAGES.get("grpo")(REWARDS, COMPS, GROUPS)
    # group 5: mean 0.5, unbiased var = 4 * 0.25 / 3 = 1/3, std 0.577350 -> +-0.5/0.577350 = +-0.866025
    # group 9: mean 1, var = (1 + 1) / 1 = 2, std 1.414214 -> +-1/1.414214 = +-0.707107
    # group 2: singleton, mean 0 std 1 -> 3 / (1 + 1e-6)
    g, s = 0.5 / (1 / math.sqrt(3) + 1e-6), 1 / (math.sqrt(2) + 1e-6)
    close(adv, [g, s, -g, 3 / (1 + 1e-6), -g, -s, g])
    assert inc.all()


def test_grpo_without_std_only_centres():
    adv, _ = ADVANTAGES.bind("grpo", {"norm_by_std": False})(REWARDS, COMPS, GROUPS)
    # group 5: R - 0.5; group 9: R - 1; singleton keeps its raw reward (mean taken as 0)
    close(adv, [0.5, 1.0, -0.5, 3.0, -0.5, -1.0, 0.5])


def test_grpo_all_equal_group_gives_zero_not_nan():
    adv, _ = ADVANTAGES.get("grpo")(torch.ones(4), torch.ones(4, 1), torch.zeros(4, dtype=torch.long))
    close(adv, [0.0, 0.0, 0.0, 0.0])  # (1 - 1) / (0 + 1e-6) = 0


def test_rloo_uses_leave_one_out_baseline_and_zero_for_singletons():
    adv, inc = ADVANTAGES.get("rloo")(REWARDS, COMPS, GROUPS)
    # group 5: R=1 -> 1 - mean(0, 0, 1) = 2/3 ; R=0 -> 0 - mean(1, 0, 1) = -2/3
    # group 9: R=2 -> 2 - 0 = 2 ; R=0 -> 0 - 2 = -2 ; singleton -> 0 by definition
    close(adv, [2 / 3, 2.0, -2 / 3, 0.0, -2 / 3, -2.0, 2 / 3])
    assert inc.all()


def test_reinforce_pp_whitens_over_the_whole_batch():
    adv, _ = ADVANTAGES.get("reinforce_pp")(REWARDS, COMPS, GROUPS)
    # batch mean = 7/7 = 1; deviations 0, 1, -1, 2, -1, -1, 0; sum of squares 8;
    # unbiased var 8/6 = 4/3, std 1.154701 -> dev / 1.154701
    s = math.sqrt(4 / 3) + 1e-6
    close(adv, [0.0, 1 / s, -1 / s, 2 / s, -1 / s, -1 / s, 0.0])


def test_reinforce_pp_baseline_subtracts_group_mean_then_whitens():
    adv, _ = ADVANTAGES.bind("reinforce_pp", {"baseline": True})(REWARDS, COMPS, GROUPS)
    # centred: 0.5, 1, -0.5, 3 (the singleton: group mean taken as 0, GRPO's rule), -0.5, -1,
    # 0.5; their mean 3/7; deviations 1/14, 4/7, -13/14, 18/7, -13/14, -10/7, 1/14;
    # sum of squares 10.714286, unbiased var / 6 = 1.785714, std 1.336306
    c = torch.tensor([0.5, 1.0, -0.5, 3.0, -0.5, -1.0, 0.5])
    dev = c - 3 / 7
    assert abs(float((dev ** 2).sum()) - 10.714286) < 1e-5
    close(adv, (dev / (math.sqrt(10.714286 / 6) + 1e-6)).tolist())


def test_reinforce_pp_whitens_over_tokens_when_given_token_counts():
    # rewards [1, 0] with 3 and 1 tokens: mean (3*1 + 0) / 4 = 0.75;
    # var (3 * 0.25^2 + 1 * 0.75^2) / (4 - 1) = 0.75 / 3 = 0.25, std 0.5 -> [0.5, -1.5]
    r = torch.tensor([1.0, 0.0])
    adv, _ = ADVANTAGES.get("reinforce_pp")(r, r[:, None], torch.tensor([0, 1]),
                                            torch.tensor([3, 1]), eps=0.0)
    close(adv, [0.5, -1.5])
    # one token each: the per-sequence whitening ((1 - 0.5) / 0.7071 = 0.7071)
    adv, _ = ADVANTAGES.get("reinforce_pp")(r, r[:, None], torch.tensor([0, 1]),
                                            torch.tensor([1, 1]), eps=0.0)
    close(adv, [0.707107, -0.707107])
    # the objective passes token counts only to estimators that take them
    from reroll.algo import build_objective
    from reroll.config import AlgoConfig

    obj = build_objective(AlgoConfig(advantage="reinforce_pp", advantage_args={"eps": 0.0}))
    close(obj.advantages(r, r[:, None], torch.tensor([0, 1]), torch.tensor([3, 1]))[0],
          [0.5, -1.5])
    grpo = build_objective(AlgoConfig(advantage="grpo"))
    # grpo ignores them: group [1, 0] -> +-0.5 / 0.707107 = +-0.707107 whatever the lengths
    close(grpo.advantages(r, r[:, None], torch.tensor([0, 0]), torch.tensor([3, 1]))[0],
          [0.707107, -0.707107])


def test_reinforce_pp_gives_each_token_the_return_from_its_position_with_the_kl_in_reward():
    # rewards [1, 0]; per-token penalties kl_coef * k(t) on 3 and 1 valid tokens (the 9s lie
    # off the mask and must not count). Returns to go, G_t = R - sum_{s >= t} kl_s:
    #   sample 0: 1 - (0.1 + 0.2 + 0.3), 1 - (0.2 + 0.3), 1 - 0.3 = 0.4, 0.5, 0.7
    #   sample 1: 0 - 0.4 = -0.4
    # whitened over the 4 valid tokens: mean 1.2 / 4 = 0.3, deviations 0.1, 0.2, 0.4, -0.7,
    # squares sum 0.70, unbiased var 0.70 / 3 -> deviation / sqrt(0.7 / 3); 0 off the mask
    r = torch.tensor([1.0, 0.0])
    kl = torch.tensor([[0.1, 0.2, 0.3], [0.4, 9.0, 9.0]])
    mask = torch.tensor([[1.0, 1.0, 1.0], [1.0, 0.0, 0.0]])
    s = math.sqrt(0.7 / 3)
    want = [[0.1 / s, 0.2 / s, 0.4 / s], [-0.7 / s, 0.0, 0.0]]
    est = ADVANTAGES.get("reinforce_pp")
    adv, include = est(r, r[:, None], torch.tensor([0, 1]), torch.tensor([3, 1]),
                       token_kl=kl, token_mask=mask, eps=0.0)
    close(adv, want)
    assert include.all()
    # baseline: the group mean of the outcome rewards (one group [1, 0]: 0.5) leaves first,
    # the penalties stay per token: G = 0.5 - [0.6, 0.5, 0.3], -0.5 - 0.4 =
    # -0.1, 0, 0.2, -0.9; mean -0.2, deviations 0.1, 0.2, 0.4, -0.7 as above
    adv, _ = est(r, r[:, None], torch.tensor([0, 0]), torch.tensor([3, 1]),
                 token_kl=kl, token_mask=mask, baseline=True, eps=0.0)
    close(adv, want)
    # "folded", reroll's earlier form: the response's whole penalty leaves its reward,
    # 1 - 0.6 = 0.4 and 0 - 0.4 = -0.4, one value per sample whitened with token counts
    # [3, 1]: mean (3 * 0.4 - 0.4) / 4 = 0.2, var (3 * 0.2^2 + 0.6^2) / 3 = 0.16, std 0.4
    adv, _ = est(r, r[:, None], torch.tensor([0, 1]), torch.tensor([3, 1]),
                 token_kl=kl, token_mask=mask, eps=0.0, kl_returns="folded")
    close(adv, [0.5, -1.5])
    with pytest.raises(ValueError, match="kl_returns"):
        est(r, r[:, None], torch.tensor([0, 1]), kl_returns="sequence")


# MC-GRPO: three groups of three.
#   group 0: 0.2, 0.9, 0.5 -> median 0.5 (sample 2 is the pivot), |dev| 0.3, 0.4, 0 -> MAD 0.3
#   group 1: 1, 0, 0       -> median 0, MAD = median(1, 0, 0) = 0  (the binary-reward case)
#   group 2: 1, 1, 1       -> all equal
MC_R = torch.tensor([0.2, 0.9, 0.5, 1.0, 0.0, 0.0, 1.0, 1.0, 1.0])
MC_G = torch.tensor([0, 0, 0, 1, 1, 1, 2, 2, 2])


def test_mc_grpo_median_baseline_mad_scale_and_pivot_excluded():
    adv, inc = ADVANTAGES.get("mc_grpo")(MC_R, MC_R[:, None], MC_G)
    # group 0: (0.2 - 0.5) / 0.301 = -0.996678 ; (0.9 - 0.5) / 0.301 = 1.328904 ; pivot 0
    # group 1: MAD 0 -> std fallback: std(1, 0, 0) = sqrt((4/9 + 1/9 + 1/9) / 2) = 0.577350,
    #          1 / (0.577350 + 0.001) = 1.729048 ; the two zeros: 0
    # group 2: all deviations 0 -> 0
    close(adv, [-0.3 / 0.301, 0.4 / 0.301, 0.0, 1 / (1 / math.sqrt(3) + 1e-3), 0, 0, 0, 0, 0])
    # pivots: group 0 sample 2; group 1: ascending stable order (s4, s5, s3), position 1 -> s5;
    # group 2: (s6, s7, s8), position 1 -> s7. Exactly one excluded per group.
    assert inc.tolist() == [True, True, False, True, True, False, True, False, True]


def test_mc_grpo_zero_mad_options_bound_the_minority_advantage():
    r, g = torch.tensor([1.0, 0.0, 0.0]), torch.zeros(3, dtype=torch.long)
    one, _ = ADVANTAGES.bind("mc_grpo", {"zero_mad": "one"})(r, r[:, None], g)
    close(one, [1 / 1.001, 0.0, 0.0])  # scale 1: 1 / (1 + 0.001)
    std, _ = ADVANTAGES.get("mc_grpo")(r, r[:, None], g)
    assert 1.7 < float(std[0]) < 1.8  # 1 / (0.57735 + 0.001) = 1.729; never ~1000
    raw, _ = ADVANTAGES.bind("mc_grpo", {"zero_mad": "eps"})(r, r[:, None], g)
    close(raw, [1000.0, 0.0, 0.0], tol=1e-2)  # the reference behaviour, kept as an option: 1 / 1e-3
    with pytest.raises(ValueError, match="zero_mad"):
        ADVANTAGES.bind("mc_grpo", {"zero_mad": "median"})(r, r[:, None], g)


def test_mc_grpo_even_group_uses_lower_median_member_as_pivot():
    r = torch.tensor([0.0, 1.0, 1.0, 0.0])
    adv, inc = ADVANTAGES.get("mc_grpo")(r, r[:, None], torch.zeros(4, dtype=torch.long))
    # sorted (s0=0, s3=0, s1=1, s2=1); lower median position (4-1)//2 = 1 -> s3, median 0
    # |dev| = 0, 1, 1, 0 -> MAD = lower median = 0 -> std fallback: std(0,1,1,0) = sqrt(1/3)
    s = 1 / math.sqrt(3) + 1e-3
    close(adv, [0.0, 1 / s, 1 / s, 0.0])
    assert inc.tolist() == [True, True, True, False]


def test_gdpo_normalises_components_separately_then_whitens():
    # group 0: components (1, 0), (0, 1); group 1: (1, 1), (0, 0); weights (1, 0.5)
    comps = torch.tensor([[1.0, 0.0], [0.0, 1.0], [1.0, 1.0], [0.0, 0.0]])
    groups = torch.tensor([0, 0, 1, 1])
    adv, inc = ADVANTAGES.bind("gdpo", {"component_weights": [1.0, 0.5]})(
        comps.sum(-1), comps, groups)
    # each component in a group of two values {1, 0}: mean 0.5, std sqrt(0.5) -> +-0.707107
    # group 0: 1 * (+0.7071, -0.7071) + 0.5 * (-0.7071, +0.7071) = (+0.353553, -0.353553)
    # group 1: 1 * (+0.7071, -0.7071) + 0.5 * (+0.7071, -0.7071) = (+1.060660, -1.060660)
    # batch mean 0, sum of squares 2 * 0.125 + 2 * 1.125 = 2.5, var 2.5 / 3, std 0.912871
    s = math.sqrt(2.5 / 3)
    close(adv, [0.353553 / s, -0.353553 / s, 1.060660 / s, -1.060660 / s], tol=1e-4)
    assert inc.all()
    # plain GRPO on the summed reward cannot tell group 0's members apart (sums 1 and 1)
    grpo, _ = ADVANTAGES.get("grpo")(comps.sum(-1), comps, groups)
    close(grpo[:2], [0.0, 0.0])


def test_gdpo_rejects_wrong_number_of_weights():
    with pytest.raises(ValueError, match="component_weights has 3 entries but the batch has K=2"):
        ADVANTAGES.bind("gdpo", {"component_weights": [1, 1, 1]})(
            torch.zeros(2), torch.zeros(2, 2), torch.zeros(2, dtype=torch.long))


@pytest.mark.parametrize("name", ADVANTAGES.names())
def test_bad_inputs_are_named(name):
    fn = ADVANTAGES.get(name)
    with pytest.raises(ValueError, match=f"'{name}'.*non-finite rewards at samples \\[1\\]"):
        fn(torch.tensor([0.0, float("nan")]), torch.zeros(2, 1), torch.zeros(2, dtype=torch.long))
    with pytest.raises(ValueError, match="group_index must be"):
        fn(torch.zeros(3), torch.zeros(3, 1), torch.zeros(2, dtype=torch.long))

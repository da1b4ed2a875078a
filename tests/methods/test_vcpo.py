"""VCPO's math by hand: sequence IS weights, ESS and the learning-rate factor (sqrt and
linear rules, clipping), and the off-policy optimal baseline (weights, length factor, scopes,
the degenerate all-zero-norm case) through the `opob` advantage estimator."""

import math

import pytest
import torch

from reroll.algo import ADVANTAGES, build_objective
from reroll.config import AlgoConfig, ConfigError
from reroll.config_checks import load_checked
from reroll.methods.vcpo import (
    EssLrHook,
    effective_sample_size,
    ess_lr_scale,
    opob_baseline,
    seq_log_weights,
)
from reroll.trainer.optim_step import step_hooks

INF = math.inf


def close(x, expect, tol=1e-4):
    assert torch.allclose(torch.as_tensor(x, dtype=torch.float64),
                          torch.tensor(expect, dtype=torch.float64), atol=tol), (x, expect)


def logs(ws):
    return torch.tensor(ws, dtype=torch.float64).log()


# ---- sequence IS weights ----------------------------------------------------------------

PROX = torch.tensor([[-1.0, -2.0, -9.0], [-1.0, -1.0, 0.0], [-3.0, 0.0, 0.0]])
BEHAV = torch.tensor([[-1.5, -2.5, 0.0], [-1.0, -0.3, 0.0], [-1.0, 0.0, 0.0]])
MASK = torch.tensor([[1.0, 1.0, 0.0], [1.0, 1.0, 0.0], [0.0, 0.0, 0.0]])


def test_sequence_log_weights_sum_the_loss_tokens_and_leave_out_empty_samples():
    # sample 0: (-1 + 1.5) + (-2 + 2.5) = 1.0, the padded -9 not counted
    # sample 1: 0 + (-1 + 0.3) = -0.7; sample 2: no loss token -> -inf (out of the ESS)
    close(seq_log_weights(PROX, BEHAV, MASK)[:2], [1.0, -0.7])
    assert seq_log_weights(PROX, BEHAV, MASK)[2] == -INF


def test_sequence_log_weights_clip_at_the_cap_then_take_the_sample_weight():
    # cap 2: sample 0's log w = min(1.0, log 2 = 0.6931); sample 1 (-0.7) is below it
    # sample weights [1, 0.5, 1]: sample 1 -> -0.7 + log 0.5 = -0.7 - 0.6931 = -1.3931
    out = seq_log_weights(PROX, BEHAV, MASK, torch.tensor([1.0, 0.5, 1.0]), cap=2.0)
    close(out[:2], [0.6931, -1.3931])
    # a weight-0 sample (e.g. pruned) carries no gradient: -inf
    assert seq_log_weights(PROX, BEHAV, MASK, torch.tensor([0.0, 1.0, 1.0]))[0] == -INF


# ---- ESS and the learning-rate factor ----------------------------------------------------


def test_ess_of_hand_computed_weights():
    # w = [1, 2, 3, 2]: (sum w)^2 / sum w^2 = 8^2 / (1 + 4 + 9 + 4) = 64 / 18 = 3.5556;
    # rho = 3.5556 / 4 = 0.8889
    ess, ratio = effective_sample_size(logs([1.0, 2.0, 3.0, 2.0]))
    close([ess, ratio], [3.5556, 0.8889])


def test_ess_of_equal_weights_is_exactly_the_batch_even_where_exp_overflows():
    assert effective_sample_size(torch.zeros(5, dtype=torch.float64)) == (5.0, 1.0)
    # exp(1000) overflows; the weights are scaled by their largest first
    assert effective_sample_size(torch.tensor([1000.0, 1000.0])) == (2.0, 1.0)
    # a left-out sample (-inf) is not counted in B: two samples of weight 1 remain
    assert effective_sample_size(torch.tensor([0.0, -INF, 0.0])) == (2.0, 1.0)
    # nothing to weigh: ratio 1, the learning rate is left alone
    assert effective_sample_size(torch.tensor([-INF])) == (0.0, 1.0)


def test_clipping_heavy_weights_raises_the_ess():
    # w = [1, 1, 8]: 10^2 / (1 + 1 + 64) = 100 / 66 = 1.5152, rho = 0.5051
    close(effective_sample_size(logs([1.0, 1.0, 8.0])), [1.5152, 0.5051])
    # clipped at 2 -> [1, 1, 2]: 4^2 / 6 = 2.6667, rho = 0.8889
    clipped = seq_log_weights(logs([[1.0], [1.0], [8.0]]).float(), torch.zeros(3, 1),
                              torch.ones(3, 1), cap=2.0)
    close(effective_sample_size(clipped), [2.6667, 0.8889])


@pytest.mark.parametrize("ratio, base, rule, expect", [
    (0.8889, 1.0, "sqrt", 0.9428),  # sqrt(0.8889)
    (0.8889, 1.0, "linear", 0.8889),
    (0.8889, 0.9, "sqrt", 0.9938),  # 0.8889 / 0.9 = 0.98765, sqrt = 0.99381
    (0.8889, 0.5, "sqrt", 1.0),  # 0.8889 / 0.5 = 1.78 > 1: capped at 1
    (0.25, 1.0, "sqrt", 0.5),
    (0.25, 1.0, "linear", 0.25),
    (1.0, 1.0, "sqrt", 1.0),
])
def test_lr_scale_rules(ratio, base, rule, expect):
    close(ess_lr_scale(ratio, base, rule), expect)


def test_lr_scale_is_exactly_one_on_policy_and_errors_are_named():
    assert ess_lr_scale(1.0, 1.0, "sqrt") == 1.0 and ess_lr_scale(1.0, 1.0, "linear") == 1.0
    with pytest.raises(ValueError, match=r"base_ratio must be in \(0, 1\], got 0"):
        ess_lr_scale(0.5, 0.0, "sqrt")
    with pytest.raises(KeyError, match="unknown ESS learning-rate rule 'cube'"):
        ess_lr_scale(0.5, 1.0, "cube")


def test_the_ess_lr_hook_with_the_option_on_and_off():
    w = logs([1.0, 2.0, 3.0, 2.0])
    [on] = step_hooks(build_objective(AlgoConfig(ess_lr=True, ess_rule="linear")))
    assert isinstance(on, EssLrHook)
    scale, m = on.scale(w)
    close([scale, m["vcpo/ess_ratio"], m["vcpo/ess"]], [0.8889, 0.8889, 3.5556])
    assert m["vcpo/lr_scale"] == scale
    assert step_hooks(build_objective(AlgoConfig())) == []  # off: no hook, the lr untouched
    # the hook's own weights use the objective's cap: w = [1, 1, 8] capped at 2 -> rho 0.8889
    [capped] = step_hooks(build_objective(AlgoConfig(ess_lr=True, ess_is_cap=2.0)))
    lw = capped.weights(logs([[1.0], [1.0], [8.0]]).float(), torch.zeros(3, 1),
                        torch.ones(3, 1))
    close(capped.scale(lw)[1]["vcpo/ess_ratio"], 0.8889)
    with pytest.raises(KeyError, match="unknown ESS learning-rate rule 'cube'"):
        step_hooks(build_objective(AlgoConfig(ess_lr=True, ess_rule="cube")))


@pytest.mark.parametrize("override, match", [
    ("algo.ess_rule=cube", "algo.ess_rule must be one of linear, sqrt, got 'cube'"),
    ("algo.ess_base_ratio=0", r"algo.ess_base_ratio must be in \(0, 1\]"),
    ("algo.ess_base_ratio=1.5", r"algo.ess_base_ratio must be in \(0, 1\]"),
    ("algo.ess_is_cap=-1", r"algo.ess_is_cap must be in \[0, inf\)"),
    ('algo.advantage_args={scope="batch"}', "scope must be group or minibatch"),
    ("algo.advantage_args={is_cap=-2.0}", r"'is_cap' \(in algo.advantage_args\) must be in"),
])
def test_bad_vcpo_settings_are_refused_at_load(override, match):
    extra = ["algo.advantage=opob"] if "advantage_args" in override else []
    with pytest.raises(ConfigError, match=match):
        load_checked(None, [*extra, override])


# ---- the off-policy optimal baseline ------------------------------------------------------

R = torch.tensor([1.0, 0.0, 0.0])
ONE_GROUP = torch.zeros(3, dtype=torch.long)


def opob(rewards=R, w=(1.0, 2.0, 1.0), sq=(4.0, 1.0, 9.0), groups=ONE_GROUP, **kw):
    fn = ADVANTAGES.bind("opob", kw)
    return fn(rewards, rewards[:, None], groups, seq_log_weights=logs(list(w)),
              grad_sq_norms=torch.tensor(sq, dtype=torch.float64))


def test_opob_baseline_weighs_rewards_by_squared_is_weight_times_squared_grad_norm():
    # u = w^2 ||g||^2 = [1*4, 4*1, 1*9] = [4, 4, 9]; b* = (4*1 + 4*0 + 9*0) / 17 = 0.23529
    b = opob_baseline(R, logs([1.0, 2.0, 1.0]), torch.tensor([4.0, 1.0, 9.0]), ONE_GROUP)
    close(b, [0.23529] * 3)
    adv, include = opob(norm_by_std=False)
    close(adv, [0.76471, -0.23529, -0.23529])  # R - b*
    assert include.all()


def test_opob_divides_by_the_groups_population_reward_std_by_default():
    # as the paper's reference: population std of [1, 0, 0] =
    # sqrt(((2/3)^2 + 2 (1/3)^2) / 3) = sqrt(2/9) = 0.47140
    # A = [0.76471, -0.23529, -0.23529] / 0.47140 = [1.62219, -0.49913, -0.49913]
    close(opob()[0], [1.62219, -0.49913, -0.49913])
    # unbiased_std: the (n - 1) std sqrt(1/3) = 0.57735 -> [1.32451, -0.40754, -0.40754]
    close(opob(unbiased_std=True)[0], [1.32451, -0.40754, -0.40754])


def test_opob_length_factor_divides_each_weight_by_its_squared_length():
    # L = [2, 1, 3]: u = [4/4, 4/1, 9/9] = [1, 4, 1]; b* = 1 / 6 = 0.16667
    b = opob_baseline(R, logs([1.0, 2.0, 1.0]), torch.tensor([4.0, 1.0, 9.0]), ONE_GROUP,
                      torch.tensor([2, 1, 3]))
    close(b, [1 / 6] * 3)
    fn = ADVANTAGES.bind("opob", {"length_norm": True, "norm_by_std": False})
    adv, _ = fn(R, R[:, None], ONE_GROUP, token_counts=torch.tensor([2, 1, 3]),
                seq_log_weights=logs([1.0, 2.0, 1.0]), grad_sq_norms=torch.tensor([4.0, 1, 9]))
    close(adv, [5 / 6, -1 / 6, -1 / 6])


def test_opob_is_cap_clips_the_weights_of_the_baseline():
    # w = [1, 4, 1] clipped at 2 -> [1, 2, 1]: u = [4, 4, 9] as above, b* = 0.23529
    close(opob(w=(1.0, 4.0, 1.0), is_cap=2.0, norm_by_std=False)[0],
          [0.76471, -0.23529, -0.23529])
    # unclipped: u = [4, 16, 9], b* = 4 / 29 = 0.13793
    close(opob(w=(1.0, 4.0, 1.0), norm_by_std=False)[0], [0.86207, -0.13793, -0.13793])


def test_all_zero_gradient_norms_fall_back_to_the_plain_mean():
    # every weight 0: b* = mean [1, 0, 0] = 1/3, as the formula gives with equal weights
    close(opob_baseline(R, torch.zeros(3), torch.zeros(3), ONE_GROUP), [1 / 3] * 3)
    # so do samples all left out (-inf log weight)
    close(opob_baseline(R, torch.full((3,), -INF), torch.ones(3), ONE_GROUP), [1 / 3] * 3)
    # one zero norm only drops that sample: u = [0, 4, 9] -> b* = 0
    close(opob_baseline(R, logs([1.0, 2.0, 1.0]), torch.tensor([0.0, 1.0, 9.0]), ONE_GROUP),
          [0.0] * 3)


def test_a_group_with_equal_rewards_gets_exactly_zero_advantage():
    r = torch.tensor([0.7, 0.7, 0.7])
    adv, _ = opob(rewards=r, w=(0.3, 5.0, 1.7), sq=(0.11, 3.0, 7.0))
    assert torch.equal(adv, torch.zeros(3))  # b* clamped into [0.7, 0.7]


def test_groups_get_their_own_baselines_and_minibatch_scope_pools_them():
    r = torch.tensor([1.0, 0.0, 1.0, 1.0, 0.0])
    gidx = torch.tensor([0, 0, 1, 1, 1])
    w, sq = (1.0, 1.0, 1.0, 1.0, 2.0), (1.0, 3.0, 1.0, 1.0, 1.0)
    # group 0: u = [1, 3] -> b* = 1/4; group 1: u = [1, 1, 4] -> b* = 2/6 = 1/3
    adv, _ = opob(rewards=r, w=w, sq=sq, groups=gidx, norm_by_std=False)
    close(adv, [0.75, -0.25, 2 / 3, 2 / 3, -1 / 3])
    # one mini-batch: u = [1, 3, 1, 1, 4], b* = (1 + 1 + 1) / 10 = 0.3
    fn = ADVANTAGES.bind("opob", {"scope": "minibatch", "norm_by_std": False})
    adv, _ = fn(r, r[:, None], gidx, seq_log_weights=logs(list(w)),
                grad_sq_norms=torch.tensor(sq), minibatch_index=torch.zeros(5, dtype=torch.long))
    close(adv, [0.7, -0.3, 0.7, 0.7, -0.3])


def test_on_policy_with_equal_norms_opob_is_grpo():
    gen = torch.Generator().manual_seed(0)
    r = torch.randint(0, 2, (12,), generator=gen).float()
    gidx = torch.arange(3).repeat_interleave(4)
    adv, _ = opob(rewards=r, w=[1.0] * 12, sq=[2.5] * 12, groups=gidx, unbiased_std=True)
    grpo, _ = ADVANTAGES.get("grpo")(r, r[:, None], gidx)
    close(adv, grpo.tolist(), tol=1e-6)
    # by default GRPO's centring over the population std of each group
    adv, _ = opob(rewards=r, w=[1.0] * 12, sq=[2.5] * 12, groups=gidx)
    g = r.view(3, 4)
    pop = ((g - g.mean(1, keepdim=True)) / (g.std(1, unbiased=False, keepdim=True) + 1e-6))
    close(adv, pop.flatten().tolist(), tol=1e-6)


def test_opob_without_the_trainers_inputs_says_what_is_missing():
    fn = ADVANTAGES.get("opob")
    with pytest.raises(ValueError, match="'opob': needs seq_log_weights and grad_sq_norms"):
        fn(R, R[:, None], ONE_GROUP)
    with pytest.raises(ValueError, match="scope 'minibatch' needs minibatch_index"):
        fn(R, R[:, None], ONE_GROUP, seq_log_weights=torch.zeros(3),
           grad_sq_norms=torch.ones(3), scope="minibatch")


def test_the_vcpo_preset_turns_on_both_halves():
    cfg = load_checked(None, ["preset=vcpo"])
    obj = build_objective(cfg.algo)
    assert obj.ess_lr and obj.ess_rule == "sqrt" and obj.wants("grad_sq_norms")
    assert build_objective(AlgoConfig()).wants("grad_sq_norms") is False  # off by default
    # the trainer computes its inputs through the estimator's trait, not by its name
    from reroll.methods.vcpo import opob_inputs

    assert obj.advantage_inputs is opob_inputs
    assert build_objective(AlgoConfig()).advantage_inputs is None
    # opob as the preset binds it, on hand-checked inputs: (R - 0.23529) / 0.47140 (the
    # population std, as the paper's reference)
    adv, _ = obj.advantages(R, R[:, None], ONE_GROUP, seq_log_weights=logs([1.0, 2.0, 1.0]),
                            grad_sq_norms=torch.tensor([4.0, 1.0, 9.0]))
    close(adv, [1.62219, -0.49913, -0.49913])

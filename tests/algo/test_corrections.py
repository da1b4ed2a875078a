"""Behaviour corrections: truncation, masking and diagnostics against hand-computed values."""

import math

import pytest
import torch

from reroll.algo import CORRECTIONS

# rho = pi_prox / mu: row 0 = 0.5, 3.0, 1.0 ; row 1 = 2.5, (masked: 9.0), (masked: inf gap)
RHO = [[0.5, 3.0, 1.0], [2.5, 9.0, 1.0]]
MASK = torch.tensor([[1.0, 1.0, 1.0], [1.0, 0.0, 0.0]])
BEHAV = torch.full((2, 3), -2.0)
PROX = BEHAV + torch.tensor(RHO).log()
PROX[1, 2] = float("-inf")  # garbage on a padded position must not leak


def close(a, b, tol=1e-5):
    assert torch.allclose(a, torch.tensor(b, dtype=a.dtype), atol=tol), (a, b)


def run(name, **kw):
    return CORRECTIONS.bind(name, kw)(PROX, BEHAV, MASK)


def test_tis_token_truncates_each_ratio_at_the_cap_and_reports_diagnostics():
    w, mask, m = run("tis_token")
    close(w, [[0.5, 2.0, 1.0], [2.0, 0.0, 0.0]])  # min(rho, 2) on trainable tokens
    close(mask, MASK.tolist())
    close(m["is/ratio_mean"], 7.0 / 4)  # (0.5 + 3 + 1 + 2.5) / 4
    close(m["is/ratio_max"], 3.0)
    close(m["is/ratio_min"], 0.5)
    close(m["is/weight_mean"], 5.5 / 4)  # (0.5 + 2 + 1 + 2) / 4
    close(m["is/ess"], 5.5 ** 2 / (4 * 9.25))  # (sum w)^2 / (N sum w^2), sum w^2 = 0.25+4+1+4
    close(m["is/dropped_frac"], 0.5)  # 3.0 and 2.5 were truncated
    # KL(mu || pi_prox): k1 = mean(-log rho) = -(-0.693147 + 1.098612 + 0 + 0.916291) / 4
    close(m["is/kl_k1"], -1.321756 / 4)
    # k3 = mean(rho - 1 - log rho) = (0.193147 + 0.901388 + 0 + 0.583709) / 4
    close(m["is/kl_k3"], 1.678244 / 4)
    assert not w.requires_grad


def test_tis_seq_truncates_the_product_of_ratios_per_sequence():
    w, mask, m = run("tis_seq")
    # row 0: 0.5 * 3 * 1 = 1.5 (kept) ; row 1: 2.5 (its masked tokens are not in the product) -> 2
    close(w, [[1.5, 1.5, 1.5], [2.0, 0.0, 0.0]])
    close(m["is/dropped_frac"], 1 / 4)


def test_mis_token_masks_tokens_outside_the_bounds():
    w, mask, m = run("mis_token")  # keep 0 <= rho <= 2
    close(mask, [[1.0, 0.0, 1.0], [0.0, 0.0, 0.0]])  # 3.0 and 2.5 masked
    close(w, [[0.5, 0.0, 1.0], [0.0, 0.0, 0.0]])  # kept tokens keep their IS weight
    close(m["is/dropped_frac"], 0.5)
    w, mask, _ = run("mis_token", lower=0.6, upper=4.0)
    close(mask, [[0.0, 1.0, 1.0], [1.0, 0.0, 0.0]])  # now 0.5 is below the lower bound


def test_areals_cap_masks_the_tokens_above_it_where_truncation_keeps_them_at_the_cap():
    # AReaL's rule is mis_token with lower 0 and upper = its cap: with cap 2.5 the ratio 3.0
    # leaves the loss and 2.5 (at the cap, not above it) stays with its weight ...
    w, mask, m = run("mis_token", lower=0.0, upper=2.5)
    close(mask, [[1.0, 0.0, 1.0], [1.0, 0.0, 0.0]])
    close(w, [[0.5, 0.0, 1.0], [2.5, 0.0, 0.0]])
    close(m["is/dropped_frac"], 1 / 4)
    # ... where tis_token with the same cap trains the 3.0 token at weight 2.5
    w, mask, _ = run("tis_token", cap=2.5)
    close(mask, MASK.tolist())
    close(w, [[0.5, 2.5, 1.0], [2.5, 0.0, 0.0]])


def test_is_token_weighs_each_token_by_its_untruncated_ratio():
    w, mask, m = run("is_token")  # DOTS's replay: no cap
    close(w, [[0.5, 3.0, 1.0], [2.5, 0.0, 0.0]])
    close(mask, MASK.tolist())
    close(m["is/weight_mean"], 7.0 / 4)  # (0.5 + 3 + 1 + 2.5) / 4
    close(m["is/ess"], 49.0 / (4 * 16.5))  # sum w^2 = 0.25 + 9 + 1 + 6.25
    close(m["is/dropped_frac"], 0.0)
    # a ratio beyond exp(20) is taken as exp(20), like every ratio here
    w, _, _ = CORRECTIONS.get("is_token")(BEHAV + 25.0, BEHAV, MASK)
    close(w[0] / math.exp(20.0), [1.0, 1.0, 1.0])


def test_mis_seq_masks_whole_sequences():
    w, mask, m = run("mis_seq")  # row products 1.5 (kept) and 2.5 (> 2, masked)
    close(mask, [[1.0, 1.0, 1.0], [0.0, 0.0, 0.0]])
    close(w, [[1.5, 1.5, 1.5], [0.0, 0.0, 0.0]])
    close(m["is/dropped_frac"], 1 / 4)


def test_mis_geo_keeps_sequences_whose_geometric_mean_ratio_is_near_one():
    # row 0: log rho 0.001, -0.0005, 0.0011 -> mean 0.000533, geo 1.000533 in [0.999, 1.001]
    # row 1: log rho 0.003 -> geo 1.003005 > 1.001 -> masked
    log_rho = torch.tensor([[0.001, -0.0005, 0.0011], [0.003, 0.0, 0.0]])
    w, mask, m = CORRECTIONS.get("mis_geo")(BEHAV + log_rho, BEHAV, MASK)
    close(mask, [[1.0, 1.0, 1.0], [0.0, 0.0, 0.0]])
    close(w, [[1.0, 1.0, 1.0], [0.0, 0.0, 0.0]])  # rejection only, no reweighting
    close(m["is/dropped_frac"], 1 / 4)


def test_none_keeps_everything_with_unit_weight():
    w, mask, m = run("none")
    close(w, MASK.tolist())
    close(mask, MASK.tolist())
    close(m["is/ess"], 1.0)  # equal weights: ESS = N^2 / (N * N) = 1


@pytest.mark.parametrize("name", CORRECTIONS.names())
def test_equal_policies_give_unit_weights_and_full_mask(name):
    w, mask, m = CORRECTIONS.get(name)(BEHAV, BEHAV, MASK)
    close(w, MASK.tolist())
    close(mask, MASK.tolist())
    close(m["is/kl_k3"], 0.0)
    assert all(torch.isfinite(v) for v in m.values())


def test_bad_hyperparameters_and_shapes_are_named():
    # through the registry (what a config does) the range is refused when it loads ...
    with pytest.raises(KeyError, match=r"'tis_token' hyperparameter 'cap' must be in "
                                       r"\(0, inf\), got 0.0"):
        run("tis_token", cap=0.0)
    # ... and the function itself still refuses it when called directly
    with pytest.raises(ValueError, match="'tis_token': cap must be > 0"):
        CORRECTIONS.get("tis_token")(PROX, BEHAV, MASK, cap=0.0)
    with pytest.raises(ValueError, match="'mis_seq': need 0 <= lower < upper"):
        run("mis_seq", lower=2.0, upper=1.0)
    with pytest.raises(ValueError, match="must share one"):
        CORRECTIONS.get("none")(PROX, BEHAV[:, :2], MASK)
    assert math.isfinite(float(run("tis_seq")[2]["is/ratio_max"]))


def test_sequence_level_corrections_clamp_the_sum_not_each_token():
    # one sequence, token log-ratios [30, -25]: prod rho = e^(30 - 25) = e^5 = 148.41.
    # Clamping each token first to +-20 would give e^(20 - 20) = 1 (a wrong "on-policy").
    prox = torch.tensor([[0.0, -25.0]])
    behav = torch.tensor([[-30.0, 0.0]])
    mask = torch.ones(1, 2)
    # tis_seq, cap 200: weight min(e^5, 200) = 148.41 on both tokens
    w, m, _ = CORRECTIONS.get("tis_seq")(prox, behav, mask, cap=200.0)
    close(w, [[math.exp(5), math.exp(5)]], tol=1e-2)
    # cap 2: truncated to 2
    w, _, _ = CORRECTIONS.get("tis_seq")(prox, behav, mask, cap=2.0)
    close(w, [[2.0, 2.0]])
    # mis_seq, bounds [0, 2]: e^5 is outside -> the whole sequence masked
    w, m, _ = CORRECTIONS.get("mis_seq")(prox, behav, mask, lower=0.0, upper=2.0)
    close(m, [[0.0, 0.0]])
    # mis_seq, bounds [0, 200]: kept with weight e^5
    w, m, _ = CORRECTIONS.get("mis_seq")(prox, behav, mask, lower=0.0, upper=200.0)
    close(m, [[1.0, 1.0]]) and close(w, [[math.exp(5), math.exp(5)]], tol=1e-2)
    # mis_geo: geometric mean e^(5/2) = 12.18, outside [0.999, 1.001] -> masked
    _, m, _ = CORRECTIONS.get("mis_geo")(prox, behav, mask)
    close(m, [[0.0, 0.0]])
    # per-token TIS still clamps each token: min(e^20, 2) = 2 and e^-20 = 2.06e-9
    w, _, _ = CORRECTIONS.get("tis_token")(prox, behav, mask, cap=2.0)
    close(w, [[2.0, math.exp(-20)]], tol=1e-8)

"""Surrogate losses against hand-computed values, and the sign of their gradients."""

import math

import pytest
import torch

from reroll.algo import AGGREGATIONS, SURROGATES


def close(a, b, tol=1e-5):
    assert torch.allclose(a, torch.tensor(b, dtype=a.dtype), atol=tol), (a, b)


def ratios_batch(log_ratios, adv, mask):
    """logprobs / prox pairs whose ratio pi_theta / pi_prox is exp(log_ratios)."""
    prox = torch.full_like(torch.tensor(log_ratios), -1.0)
    return prox + torch.tensor(log_ratios), prox, torch.tensor(adv), torch.tensor(mask)


# row 0: ratios 1.5, 0.5, 1.1 with A = +1, +1, -2 ; row 1: ratios 0.7, 4.0, (pad) with A = -2, -1
L = [[math.log(1.5), math.log(0.5), math.log(1.1)], [math.log(0.7), math.log(4.0), 0.0]]
A = [[1.0, 1.0, -2.0], [-2.0, -1.0, 0.0]]
M = [[1.0, 1.0, 1.0], [1.0, 1.0, 0.0]]


def test_ppo_clip_values_and_clip_fractions():
    loss, m = SURROGATES.get("ppo_clip")(*ratios_batch(L, A, M))
    # r=1.5 A=+1: max(-1.5, -1.2) = -1.2 (clipped high)
    # r=0.5 A=+1: max(-0.5, -0.8) = -0.5 (unclipped: a low ratio with A > 0 is not clipped)
    # r=1.1 A=-2: max(2.2, 2.2)   =  2.2
    # r=0.7 A=-2: max(1.4, 1.6)   =  1.6 (clipped low)
    # r=4.0 A=-1: max(4.0, 1.2)   =  4.0 ; padding -> 0
    close(loss, [[-1.2, -0.5, 2.2], [1.6, 4.0, 0.0]])
    close(m["clip_frac_low"], 1 / 5)
    close(m["clip_frac_high"], 1 / 5)
    # ppo_kl = mean(-log r) = -(0.405465 - 0.693147 + 0.095310 - 0.356675 + 1.386294) / 5
    close(m["ppo_kl"], -0.837247 / 5)


def test_ppo_clip_higher_and_dual_clip():
    loss, m = SURROGATES.bind("ppo_clip", {"clip_high": 0.28, "dual_clip": 3.0})(
        *ratios_batch(L, A, M))
    # r=1.5 A=+1 now clipped at 1.28 -> -1.28 ; r=4.0 A=-1: 4.0 capped at -c A = 3.0
    close(loss, [[-1.28, -0.5, 2.2], [1.6, 3.0, 0.0]])
    close(m["clip_frac_dual"], 1 / 5)


def test_ppo_clip_rejects_bad_bounds():
    with pytest.raises(KeyError, match=r"'dual_clip' must be in \(1, inf\), got 0.5"):
        SURROGATES.bind("ppo_clip", {"dual_clip": 0.5})  # refused where the config loads
    with pytest.raises(KeyError, match=r"'clip_high' must be in \[0, inf\), got -1"):
        SURROGATES.bind("ppo_clip", {"clip_high": -1})
    with pytest.raises(ValueError, match="dual_clip must be > 1"):  # and by the function
        SURROGATES.get("ppo_clip")(*ratios_batch(L, A, M), dual_clip=0.5)
    with pytest.raises(ValueError, match="advantages has shape"):
        SURROGATES.get("ppo_clip")(torch.zeros(2, 3), torch.zeros(2, 3), torch.zeros(2, 2),
                                   torch.ones(2, 3))


def test_gspo_clips_whole_sequences_on_the_geometric_mean_ratio():
    # row 0: log ratios 0.0002, 0.0004 -> mean 0.0003, s = exp(0.0003) = 1.00030005 inside
    #        [1 - 3e-4, 1 + 4e-4], A = +1 -> -1.00030005 on both tokens
    # row 1: log ratio 0.001 -> s = 1.0010005 > 1.0004, A = +2 -> clipped: -2 * 1.0004 = -2.0008
    # row 2: log ratio -0.001 -> s = 0.9990005 < 0.9997, A = -1 -> max(0.9990005, 0.9997) = 0.9997
    lr = [[0.0002, 0.0004], [0.001, 0.0], [-0.001, 0.0]]
    adv = [[1.0, 1.0], [2.0, 0.0], [-1.0, 0.0]]
    mask = [[1.0, 1.0], [1.0, 0.0], [1.0, 0.0]]
    loss, m = SURROGATES.get("gspo")(*ratios_batch(lr, adv, mask))
    close(loss, [[-math.exp(0.0003)] * 2, [-2.0008, 0.0], [0.9997, 0.0]], tol=1e-6)
    close(m["clip_frac_high"], 1 / 4)  # one of four trainable tokens
    close(m["clip_frac_low"], 1 / 4)
    tok, _ = SURROGATES.get("gspo_token")(*ratios_batch(lr, adv, mask))
    close(tok, loss.tolist(), tol=1e-6)  # GSPO-token has GSPO's values when A is per sequence


def test_gspo_token_has_gspo_gradient_when_advantages_are_per_sequence():
    torch.manual_seed(0)
    prox = -torch.rand(3, 4)
    mask = torch.tensor([[1.0, 1, 1, 1], [1, 1, 0, 0], [1, 1, 1, 0]])
    adv = torch.tensor([1.0, -0.5, 2.0])[:, None].expand(3, 4)
    grads = []
    for name in ("gspo", "gspo_token"):
        logp = (prox + 1e-4 * torch.randn(3, 4, generator=torch.Generator().manual_seed(1))
                ).requires_grad_()
        loss, _ = SURROGATES.get(name)(logp, prox, adv, mask)
        AGGREGATIONS.get("seq_mean_token_mean")(loss, mask, float(mask.sum()), 3.0).backward()
        grads.append(logp.grad)
    # d/dlogp_t of -(s_i A_i) averaged over sequences: -A_i s_i / (|o_i| * 3)
    assert torch.allclose(grads[0], grads[1], atol=1e-7)
    close(grads[0][1, :2], [0.5 / 6] * 2, tol=1e-4)  # A=-0.5, s~1, |o|=2, B=3 -> +0.083333


def test_reinforce_is_minus_advantage_times_logprob():
    logp, prox = torch.tensor([[-0.5, -1.0]]), torch.tensor([[-0.5 - math.log(1.5), -1.0]])
    adv, mask = torch.tensor([[2.0, -1.0]]), torch.ones(1, 2)
    loss, _ = SURROGATES.get("reinforce")(logp, prox, adv, mask)
    close(loss, [[1.0, -1.0]])  # -2 * -0.5 = 1 ; -(-1) * -1 = -1
    loss, m = SURROGATES.bind("reinforce", {"ratio": True, "ratio_cap": 1.2})(logp, prox, adv, mask)
    close(loss, [[1.2, -1.0]])  # token 0 has ratio 1.5, truncated to 1.2 ; token 1 ratio 1
    close(m["ratio_capped_frac"], 0.5)


def test_padding_with_infinite_logprobs_gives_finite_loss_and_gradient():
    logp = torch.tensor([[-1.0, float("-inf")]], requires_grad=True)
    prox = torch.tensor([[-1.2, float("-inf")]])
    for name in SURROGATES.names():
        loss, _ = SURROGATES.get(name)(logp, prox, torch.ones(1, 2), torch.tensor([[1.0, 0.0]]))
        loss.sum().backward()
        assert torch.isfinite(loss).all() and torch.isfinite(logp.grad).all(), name
        logp.grad = None


@pytest.mark.parametrize("name", SURROGATES.names())
@pytest.mark.parametrize("sign", [1.0, -1.0])
def test_one_sgd_step_moves_sampled_token_probability_with_the_advantage(name, sign):
    torch.manual_seed(0)
    logits = torch.randn(2, 3, 5, requires_grad=True)  # [B, T, V]
    tokens = torch.tensor([[1, 4, 2], [0, 3, 3]])  # [B, T] sampled tokens

    def token_logp():
        return logits.log_softmax(-1).gather(-1, tokens[..., None]).squeeze(-1)  # [B, T]

    before = token_logp().detach()
    mask = torch.ones(2, 3)
    loss, _ = SURROGATES.get(name)(token_logp(), before, torch.full((2, 3), sign), mask)
    AGGREGATIONS.get("token_mean")(loss, mask, 6.0, 2.0).backward()
    with torch.no_grad():
        logits -= 1.0 * logits.grad
    after = token_logp().detach()
    # every sampled token's probability rises for A > 0 and falls for A < 0
    assert ((after - before) * sign > 0).all(), (name, after - before)

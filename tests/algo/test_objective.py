"""The composed Objective: decoupled PPO, KL placement, micro-batch invariance, wiring."""

import math

import pytest
import torch

from reroll.algo import AGGREGATIONS, CORRECTIONS, SURROGATES, LossInputs, build_objective
from reroll.config import AlgoConfig
from reroll.registry import RegistryError


def close(a, b, tol=1e-5):
    assert torch.allclose(a, torch.tensor(b, dtype=a.dtype), atol=tol), (a, b)


def random_inputs(seed=0, B=4, T=5, gap=0.3):
    g = torch.Generator().manual_seed(seed)
    prox = -torch.rand(B, T, generator=g) * 2
    behav = prox + gap * torch.randn(B, T, generator=g)
    logp = (prox + 0.2 * torch.randn(B, T, generator=g)).requires_grad_()
    lengths = torch.tensor([5, 2, 4, 1])[:B]
    mask = (torch.arange(T)[None] < lengths[:, None]).float()
    adv = torch.randn(B, generator=g)[:, None].expand(B, T).contiguous()
    ref = prox + 0.1 * torch.randn(B, T, generator=g)
    return LossInputs(logp, prox, behav, adv, mask, float(mask.sum()), float(B), ref)


@pytest.mark.parametrize("correction", CORRECTIONS.names())
def test_decoupled_ppo_equals_plain_ppo_when_behaviour_is_proximal(correction):
    inp = random_inputs()
    inp.behav_logprobs = inp.prox_logprobs.clone()
    obj = build_objective(AlgoConfig(correction=correction))
    loss, _ = obj.loss(inp)
    (g1,) = torch.autograd.grad(loss, inp.logprobs)
    per_tok, _ = SURROGATES.get("ppo_clip")(inp.logprobs, inp.prox_logprobs, inp.advantages,
                                            inp.mask)
    plain = AGGREGATIONS.get("token_mean")(per_tok, inp.mask, inp.n_tokens, inp.n_seqs)
    (g2,) = torch.autograd.grad(plain, inp.logprobs)
    assert torch.allclose(loss, plain, atol=1e-7) and torch.allclose(g1, g2, atol=1e-7)


def test_decoupled_loss_weights_each_token_by_the_truncated_behaviour_ratio():
    # pi_prox / mu = 3.0 and 0.5 -> TIS weights 2.0 and 0.5 ; pi_theta = pi_prox, A = +1
    prox = torch.tensor([[-1.0, -2.0]])
    behav = prox - torch.tensor([[math.log(3.0), math.log(0.5)]])
    logp = prox.clone().requires_grad_()
    inp = LossInputs(logp, prox, behav, torch.ones(1, 2), torch.ones(1, 2), 2.0, 1.0)
    loss, m = build_objective(AlgoConfig()).loss(inp)
    # per token -w * r * A = -2, -0.5 ; token_mean over 2 tokens -> -1.25
    close(loss, -1.25)
    loss.backward()
    close(logp.grad, [[-1.0, -0.25]])  # d/dlogp (-w exp(logp - prox) A / 2) = -w / 2
    close(m["is/dropped_frac"], 0.5)
    assert all(v.dim() == 0 and not v.requires_grad for v in m.values())


def test_kl_in_loss_adds_coef_times_aggregated_estimate():
    prox = torch.tensor([[-1.0, -2.0]])
    logp = prox.clone().requires_grad_()
    ref = prox - torch.tensor([[0.5, -1.0]])  # k1 = logp - ref = 0.5, -1.0 -> token mean -0.25
    inp = LossInputs(logp, prox, prox, torch.zeros(1, 2), torch.ones(1, 2), 2.0, 1.0, ref)
    obj = build_objective(AlgoConfig(kl="k1", kl_coef=0.1))
    assert obj.needs_ref
    loss, m = obj.loss(inp)
    close(loss, 0.1 * -0.25)  # zero advantages -> policy loss 0
    close(m["loss/kl"], -0.25)
    with pytest.raises(ValueError, match="needs LossInputs.ref_logprobs"):
        obj.loss(LossInputs(logp, prox, prox, torch.zeros(1, 2), torch.ones(1, 2), 2.0, 1.0))


def test_kl_in_reward_leaves_the_loss_and_gives_a_detached_penalty():
    prox = torch.tensor([[-1.0, -2.0]])
    ref = prox - torch.tensor([[0.5, -1.0]])
    obj = build_objective(AlgoConfig(kl="k1", kl_coef=0.1, kl_in_reward=True))
    assert obj.needs_ref and obj.kl_in_reward
    inp = LossInputs(prox.clone().requires_grad_(), prox, prox, torch.zeros(1, 2),
                     torch.ones(1, 2), 2.0, 1.0, ref)
    loss, m = obj.loss(inp)
    close(loss, 0.0)
    assert "loss/kl" not in m
    close(obj.kl_reward_penalty(prox, ref, torch.tensor([[1.0, 1.0]])), [[0.05, -0.1]])


def test_no_reference_needed_without_kl():
    assert not build_objective(AlgoConfig()).needs_ref


@pytest.mark.parametrize("aggregation,args", [("token_mean", {}), ("seq_mean_token_mean", {}),
                                              ("seq_mean_token_sum_norm", {"divisor": 5.0})])
def test_objective_micro_batches_sum_to_the_whole_batch(aggregation, args):
    obj = build_objective(AlgoConfig(aggregation=aggregation, aggregation_args=args,
                                     kl="k3", kl_coef=0.05, correction="mis_token"))
    inp = random_inputs(gap=0.8)  # large gap so mis_token actually masks some tokens
    whole, _ = obj.loss(inp)
    (g_whole,) = torch.autograd.grad(whole, inp.logprobs)
    total = 0.0
    for s in (slice(0, 1), slice(1, 4)):
        part = LossInputs(inp.logprobs[s], inp.prox_logprobs[s], inp.behav_logprobs[s],
                          inp.advantages[s], inp.mask[s], inp.n_tokens, inp.n_seqs,
                          inp.ref_logprobs[s])
        total = total + obj.loss(part)[0]
    (g_parts,) = torch.autograd.grad(total, inp.logprobs)
    assert torch.allclose(total, whole, atol=1e-6) and torch.allclose(g_parts, g_whole, atol=1e-6)


def test_build_objective_names_bad_hyperparameters():
    with pytest.raises(RegistryError, match="surrogate 'ppo_clip' has no hyperparameter 'clip'.*"
                                            "algo.surrogate_args"):
        build_objective(AlgoConfig(surrogate_args={"clip": 0.2}))
    with pytest.raises(RegistryError, match="unknown correction 'tis'"):
        build_objective(AlgoConfig(correction="tis"))
    with pytest.raises(ValueError, match="kl_coef must be >= 0"):
        build_objective(AlgoConfig(kl_coef=-1.0))


def test_infinite_logprobs_on_padding_leave_loss_and_gradient_finite():
    inf = float("-inf")
    logp = torch.tensor([[-1.0, inf]], requires_grad=True)
    prox, behav = torch.tensor([[-1.1, inf]]), torch.tensor([[-0.9, inf]])
    ref = torch.tensor([[-1.3, inf]])
    obj = build_objective(AlgoConfig(kl="k3", kl_coef=0.1))
    loss, m = obj.loss(LossInputs(logp, prox, behav, torch.ones(1, 2),
                                  torch.tensor([[1.0, 0.0]]), 1.0, 1.0, ref))
    loss.backward()
    assert torch.isfinite(loss) and torch.isfinite(logp.grad).all()
    assert all(torch.isfinite(v) for v in m.values())


def test_sample_weights_scale_each_samples_policy_term_and_keep_the_normalisers():
    # two samples, one token each, pi_theta = pi_prox = mu (ratio 1, no clipping, no IS):
    # ppo_clip per-token loss = -A; token_mean over n_tokens = 2.
    # A = [1, -3], weights [2, 0.5]: loss = (-(1)*2 + -(-3)*0.5) / 2 = (-2 + 1.5) / 2 = -0.25
    lp = torch.zeros(2, 1, requires_grad=True)
    adv = torch.tensor([[1.0], [-3.0]])
    mask = torch.ones(2, 1)
    inp = LossInputs(lp, torch.zeros(2, 1), torch.zeros(2, 1), adv, mask, 2.0, 2.0,
                     sample_weights=torch.tensor([2.0, 0.5]))
    loss, _ = build_objective(AlgoConfig(correction="none")).loss(inp)
    close(loss, -0.25)
    # d loss / d logp = -A * w / 2 (ratio 1): [-1, 0.75]
    (g,) = torch.autograd.grad(loss, lp)
    close(g, [[-1.0], [0.75]])
    # weights of 1 are the unweighted loss: (-1 + 3) / 2 = 1
    inp.sample_weights = torch.ones(2)
    close(build_objective(AlgoConfig(correction="none")).loss(inp)[0], 1.0)

"""KL estimators and the reward-side penalty against hand-computed values."""

import math

import torch

from reroll.algo import KL_ESTIMATORS, kl_reward_penalty

LOGP = torch.tensor([[-1.0, -2.0]])
REF = torch.tensor([[-1.5, -1.0]])  # delta = logp - ref = 0.5, -1.0


def close(a, b, tol=1e-5):
    assert torch.allclose(a, torch.tensor(b, dtype=a.dtype), atol=tol), (a, b)


def test_k1_is_the_log_ratio():
    close(KL_ESTIMATORS.get("k1")(LOGP, REF), [[0.5, -1.0]])


def test_k2_is_half_the_squared_log_ratio():
    close(KL_ESTIMATORS.get("k2")(LOGP, REF), [[0.125, 0.5]])  # 0.5^2/2, 1^2/2


def test_k3_values_and_clamps():
    # exp(-0.5) - 1 + 0.5 = 0.606531 - 0.5 = 0.106531 ; exp(1) - 1 - 1 = 0.718282
    close(KL_ESTIMATORS.get("k3")(LOGP, REF), [[math.exp(-0.5) - 0.5, math.e - 2]])
    # delta 30 -> clamped to 20: exp(-20) - 1 + 20 = 19.0 -> result clamped to 10
    # delta -30 -> clamped to -20: exp(20) - 21 (huge) -> 10
    close(KL_ESTIMATORS.get("k3")(torch.tensor([30.0, -30.0]), torch.zeros(2)), [10.0, 10.0])


def test_k2_and_k3_gradients():
    logp = LOGP.clone().requires_grad_()
    KL_ESTIMATORS.get("k2")(logp, REF).sum().backward()
    close(logp.grad, [[0.5, -1.0]])  # d/dx x^2/2 = delta
    logp.grad = None
    KL_ESTIMATORS.get("k3")(logp, REF).sum().backward()
    close(logp.grad, [[1 - math.exp(-0.5), 1 - math.e]])  # d/dd (exp(-d) - 1 + d) = 1 - exp(-d)


def test_reward_penalty_is_scaled_masked_and_detached():
    logp = LOGP.clone().requires_grad_()
    pen = kl_reward_penalty(KL_ESTIMATORS.get("k1"), logp, REF, torch.tensor([[1.0, 0.0]]), 0.1)
    close(pen, [[0.05, 0.0]])  # 0.1 * 0.5 ; masked token -> 0
    assert not pen.requires_grad

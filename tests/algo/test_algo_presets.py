"""Every preset loads through the config system, builds an Objective, and trains on a batch."""

import pytest
import torch

from reroll.algo import LossInputs, build_objective
from reroll.config_checks import load_checked

PRESETS = ["grpo", "dr_grpo", "dapo", "gspo", "rloo", "reinforce_pp", "mc_grpo", "gdpo", "dars",
           "ar3po"]


@pytest.mark.parametrize("name", PRESETS)
def test_preset_loads_builds_and_gives_finite_loss_and_gradient(name, device):
    """Advantages on the CPU (as the trainer computes them), the loss on ``device``."""
    cfg = load_checked(None, [f"preset={name}"])
    obj = build_objective(cfg.algo)
    G, n_groups, T, V = cfg.rollout.group_size, 3, 6, 7
    N = G * n_groups
    gen = torch.Generator().manual_seed(0)
    rewards = torch.randint(0, 2, (N,), generator=gen).float()
    comps = torch.stack([rewards, torch.randint(0, 2, (N,), generator=gen).float()], 1)
    gidx = torch.arange(n_groups).repeat_interleave(G)
    adv, include = obj.advantages(rewards, comps, gidx)
    assert adv.shape == (N,) and torch.isfinite(adv).all()

    def noise(*shape):  # drawn on the CPU (the same numbers whatever the device), moved
        return torch.randn(*shape, generator=gen).to(device)

    logits = noise(N, T, V).requires_grad_()
    tokens = torch.randint(0, V, (N, T), generator=gen).to(device)
    logp = logits.log_softmax(-1).gather(-1, tokens[..., None]).squeeze(-1)  # [N, T]
    prox = logp.detach() + 0.01 * noise(N, T)
    behav = prox + 0.05 * noise(N, T)
    lengths = torch.randint(1, T + 1, (N,), generator=gen)
    mask = ((torch.arange(T)[None] < lengths[:, None]).float()
            * include.float()[:, None]).to(device)
    ref = prox + 0.1 * noise(N, T) if obj.needs_ref else None
    inp = LossInputs(logp, prox, behav, adv.to(device)[:, None].expand(N, T), mask,
                     float(mask.sum()), float(N), ref)
    loss, metrics = obj.loss(inp)
    loss.backward()
    assert torch.isfinite(loss) and torch.isfinite(logits.grad).all()
    assert logits.grad.abs().sum() > 0
    assert all(torch.isfinite(v) for v in metrics.values())


def test_preset_keys_are_applied_and_user_keys_win():
    dapo = load_checked(None, ["preset=dapo"])
    assert dapo.algo.surrogate_args == {"clip_low": 0.2, "clip_high": 0.28}
    assert dapo.algo.dynamic_sampling and dapo.algo.overlong_buffer == 2
    assert load_checked(None, ["preset=mc_grpo"]).rollout.group_size == 3
    mine = load_checked(None, ["preset=dapo", "algo.kl_coef=0.01", "rollout.group_size=4"])
    assert mine.algo.kl_coef == 0.01 and mine.rollout.group_size == 4
    assert mine.algo.surrogate_args["clip_high"] == 0.28

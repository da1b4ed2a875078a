"""XRPO (`reroll.methods.xrpo`): novelty-aware advantage sharpening by hand, the trainer
handing the estimator each sample's mean behaviour log-prob, and why the allocator settles
at one size at its defaults."""

import math

import pytest
import torch

from reroll.algo import build_objective
from reroll.config import AlgoConfig
from reroll.methods.xrpo import novelty_sharpen, xrpo_gain


def test_novelty_sharpening_by_hand():
    """XRPO sharpens the advantage of correct answers the policy found unlikely (our reading:
    A (1 + novelty min(z, cap)) for A > 0, z the mean log-prob's shortfall below the group's
    mean in group std). Group of 4: rewards 1, 1, 0, 0 -> GRPO A = +-0.866 (std 0.5774);
    mean log-probs -1, -3, -2, -2: mean -2, unbiased std sqrt(2/3) = 0.8165, so z = -1.2247
    (likely: unchanged), 1.2247 (novel: x (1 + 0.5 * 1.2247) = 1.6124), 0, 0; the negative
    advantages are never touched."""
    obj = build_objective(AlgoConfig(advantage="xrpo"))
    assert obj.wants("mean_logprobs")
    rewards = torch.tensor([1.0, 1.0, 0.0, 0.0])
    lp = torch.tensor([-1.0, -3.0, -2.0, -2.0])
    adv, include = obj.advantages(rewards, rewards[:, None], torch.zeros(4, dtype=torch.long),
                                  mean_logprobs=lp)
    a = 0.5 / math.sqrt(1 / 3)  # GRPO: (1 - 0.5) / 0.57735 (eps 1e-6 aside)
    z = 1.0 / math.sqrt(2 / 3)
    assert adv.tolist() == pytest.approx([a, a * (1 + 0.5 * z), -a, -a], rel=1e-5)
    assert include.all()
    # cap: l = -1, -3: mean -2, std sqrt(2), z = 0.7071 clipped at 0.5 -> factor 1 + 1 * 0.5;
    # a singleton group is left alone
    capped = novelty_sharpen(torch.tensor([1.0, 1.0]), torch.tensor([-1.0, -3.0]),
                             torch.tensor([0, 0]), novelty=1.0, cap=0.5)
    assert capped.tolist() == pytest.approx([1.0, 1.5])
    alone = novelty_sharpen(torch.tensor([1.0]), torch.tensor([-9.0]), torch.tensor([0]),
                            novelty=1.0)
    assert alone.tolist() == [1.0]


def test_why_the_allocator_settles_at_eight_at_its_defaults():
    """At n0 = 4, chunk = 2 every prompt's gain at n = 8 is below every prompt's gain at
    n = 6 (the std moves it by under 2x, one chunk by more), so the price that meets a mean of
    8 stops every group at 8; with chunk = 1 the gains at 7 and 8 overlap."""
    def gains(n):
        return [xrpo_gain([1.0] * c + [0.0] * (n - c)) for c in range(n + 1)]

    assert max(gains(8)) < min(gains(6))
    assert max(gains(8)) > min(gains(7))


def test_a_tiny_xrpo_run_sharpens_with_the_recorded_log_probs(small_run, tmp_path, monkeypatch):
    """``preset = "xrpo"`` composes the allocator and the sharpened advantage; the trainer
    hands the estimator each sample's mean behaviour log-prob over its loss tokens."""
    from reroll.methods import xrpo
    from reroll.runtime import train

    seen = []
    real = xrpo.novelty_sharpen

    def spy(adv, mean_logprobs, group_index, **kw):
        seen.append(mean_logprobs.clone())
        return real(adv, mean_logprobs, group_index, **kw)

    monkeypatch.setattr(xrpo, "novelty_sharpen", spy)
    # room for a group of n_max 16 plus the preset's 4 seeded samples (20 <= 5 x 4), and
    # for the seeded prompts' exemplars in the context
    cfg = small_run(tmp_path, "preset=xrpo", "train.steps=2", "rollout.batch_groups=5",
                    "model.max_position=128")
    assert cfg.algo.advantage == "xrpo" and cfg.control.allocator == "xrpo"
    train(cfg, progress=False)
    assert len(seen) == 2
    assert all(torch.isfinite(s).all() and (s <= 0).all() and (s < 0).any() for s in seen)

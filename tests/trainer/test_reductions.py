"""Metrics combine across an update's passes as each key declares (`reroll.trainer.reductions`):
the arithmetic by hand, every metric a registered objective can report declared, an
undeclared key averaged with one warning, and the pass counters' metrics."""

import pytest
import torch

from reroll.algo import CORRECTIONS, SURROGATES, LossInputs, build_objective
from reroll.config import AlgoConfig
from reroll.trainer.reductions import REDUCTIONS, PassCounts, UpdateMetrics


def test_each_reduction_combines_as_declared_by_hand():
    # two mini-batches; passes of 3 and 1 samples in the first, 4 in the second (8 in all)
    m = UpdateMetrics(minibatches=2, samples=8)
    for value, n in ((0.5, 3), (0.25, 1), (1.0, 4)):
        m.add_all({"loss/policy": value, "ppo_kl": value, "is/ratio_max": value,
                   "is/ratio_min": value}, samples=n)
    for gn, ratio in ((2.0, 1.0), (3.0, 0.5)):  # each mini-batch's optimiser step
        m.add_all({"grad_norm": gn, "vcpo/ess_ratio": ratio, "vcpo/ess_ratio_min": ratio})
    assert m.values == {
        "loss/policy": (0.5 + 0.25) / 2 + 1.0 / 2,  # shares add per mini-batch, then mean
        "ppo_kl": 0.5 * 3 / 8 + 0.25 * 1 / 8 + 1.0 * 4 / 8,  # weighted by samples passed
        "is/ratio_max": 1.0,
        "is/ratio_min": 0.25,
        "grad_norm": 3.0,  # the last optimiser step's
        "vcpo/ess_ratio": 0.75,
        "vcpo/ess_ratio_min": 0.5,
    }


def test_a_declared_start_bounds_a_min():
    m = UpdateMetrics(minibatches=1, samples=1)
    m.add("vcpo/ess_ratio_min", 1.5)  # starts from 1.0: the smallest ratio never exceeds it
    assert m.values["vcpo/ess_ratio_min"] == 1.0


def test_an_undeclared_metric_is_averaged_over_samples_with_one_warning_and_can_be_declared():
    """A user component's new metric neither stops the run nor goes unsaid: one warning
    names it, and it is averaged over samples; `declare` gives it a reduction of its own."""
    import warnings

    from reroll.trainer.reductions import Reduce, declare

    try:
        m = UpdateMetrics(minibatches=1, samples=4)
        with pytest.warns(UserWarning, match="metric 'my/new' declares no reduction"):
            m.add("my/new", 1.0, samples=1)
        with warnings.catch_warnings():
            warnings.simplefilter("error")  # said once
            m.add("my/new", 3.0, samples=3)
        assert m.values["my/new"] == 1.0 * 1 / 4 + 3.0 * 3 / 4  # weighted by samples: 2.5
        declare("my/max", Reduce.MAX)
        m.add_all({"my/max": 2.0}, samples=1)
        m.add_all({"my/max": 5.0}, samples=3)
        assert m.values["my/max"] == 5.0
    finally:
        REDUCTIONS.pop("my/new", None)
        REDUCTIONS.pop("my/max", None)


@pytest.mark.parametrize("surrogate", SURROGATES.names())
@pytest.mark.parametrize("correction", CORRECTIONS.names())
def test_every_metric_a_registered_objective_reports_declares_its_reduction(surrogate,
                                                                            correction):
    args = {"reinforce": {"ratio": True, "ratio_cap": 2.0},
            "ppo_clip": {"dual_clip": 3.0}}.get(surrogate, {})
    obj = build_objective(AlgoConfig(surrogate=surrogate, surrogate_args=args,
                                     correction=correction, kl_coef=0.1))
    g = torch.Generator().manual_seed(0)
    lp = -torch.rand(2, 5, generator=g)
    inp = LossInputs(logprobs=lp, prox_logprobs=lp - 0.1, behav_logprobs=lp - 0.3,
                     advantages=torch.tensor([[1.0] * 5, [-1.0] * 5]),
                     mask=torch.ones(2, 5), n_tokens=10.0, n_seqs=2.0,
                     ref_logprobs=lp - 0.2)
    _, metrics = obj.loss(inp)
    assert metrics and set(metrics) <= set(REDUCTIONS)


def test_pass_counts_give_padding_positions_and_entropy():
    c = PassCounts(positions=20.0, real_tokens=15.0, entropy_sum=6.0, entropy_tokens=4.0)
    assert c.metrics() == {"train/padding_share": 0.25, "train/positions": 20.0,
                           "train/entropy": 1.5}
    assert PassCounts().metrics() == {"train/padding_share": 1.0, "train/positions": 0.0,
                                      "train/entropy": 0.0}
